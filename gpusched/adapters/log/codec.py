"""Domain events <-> the protobuf ``EventEnvelope`` on the wire.

Domain dataclasses and protobuf messages use the same field names, so one conversion
plan per class, built once from the dataclass's type hints, serves every event type:
nested dataclasses map to messages, tuples to repeated fields, enums to the prefixed
proto enum values (``JobPhase.RUNNING`` <-> ``JOB_PHASE_RUNNING``), and node labels to
a proto map. A new event needs its dataclass, its proto message and a line in
``EVENT_TYPES``; nothing here. A record of a newer log schema stops the reader (log_schema).
"""
from __future__ import annotations

import dataclasses
import enum
import re
import typing
from functools import cache
from typing import Any, Callable

from gpusched.adapters.log import flat
from gpusched.core import events as ev
from gpusched.core import model
from gpusched.adapters.log.log_schema import LOG_SCHEMA, NewerLogSchema
from gpusched.v1 import events_pb2, types_pb2

_ENVELOPE_FIELDS = ("event_id", "time", "producer")


class DecodeError(ValueError):
    """A record that is not a valid gpusched event; it goes to the dead-letter topic."""


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper()


@cache
def _plan(cls: type) -> list[tuple[str, Callable[[Any, Any], Any], Callable[[Any], Any]]]:
    """(field, to_proto(msg, value) setter, from_proto(value) getter) for each field."""
    hints = typing.get_type_hints(cls, vars(model) | vars(ev))
    plan = []
    for f in dataclasses.fields(cls):
        if f.name in _ENVELOPE_FIELDS and issubclass(cls, ev.Event):
            continue
        plan.append((f.name, *_converters(f.name, hints[f.name])))
    return plan


def _converters(name: str, hint: Any):
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple and args and typing.get_origin(args[0]) is tuple:   # labels
        def put(msg, v):
            getattr(msg, name).update(dict(v))
        return put, lambda pv: tuple(sorted(pv.items()))
    if origin is tuple:
        item = args[0]
        if dataclasses.is_dataclass(item):
            def put(msg, v):
                repeated = getattr(msg, name)
                for x in v:
                    _fill(repeated.add(), x)
            return put, lambda pv: tuple(_build(item, m) for m in pv)
        return (lambda msg, v: getattr(msg, name).extend(v)), tuple
    if dataclasses.is_dataclass(hint):
        return (lambda msg, v: _fill(getattr(msg, name), v)), lambda pv: _build(hint, pv)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        prefix = _snake(hint.__name__) + "_"
        enum_type = getattr(types_pb2, hint.__name__)
        def put(msg, v):
            setattr(msg, name, enum_type.Value(prefix + v.name))
        def get(pv):
            label = enum_type.Name(pv)
            if not label.startswith(prefix) or label.endswith("UNSPECIFIED"):
                raise DecodeError(f"{name}: {label} is not a valid {hint.__name__}")
            return hint[label[len(prefix):]]
        return put, get
    def put_scalar(msg, v):
        setattr(msg, name, v)
    return put_scalar, hint_scalar(hint)


def hint_scalar(hint: Any) -> Callable[[Any], Any]:
    return {int: int, float: float, str: str, bool: bool}.get(hint, lambda v: v)


def _fill(msg, obj) -> None:
    for name, put, _ in _plan(type(obj)):
        put(msg, getattr(obj, name))


_OPTIONAL_CACHE: dict[Any, set[str]] = {}


def _present_optional(msg) -> set[str]:
    """Fields declared `optional` in proto, so unset means 'use the dataclass default'."""
    desc = msg.DESCRIPTOR
    names = _OPTIONAL_CACHE.get(desc)
    if names is None:
        names = _OPTIONAL_CACHE[desc] = _optional_fields(desc)
    return names


def _optional_fields(desc) -> set[str]:
    """A proto3 ``optional`` field is the one member of a synthetic oneof named ``_<field>``."""
    return {f.name for f in desc.fields if f.containing_oneof is not None and f.containing_oneof.name.startswith("_")}


def _build(cls: type, msg) -> Any:
    optional = _present_optional(msg)
    kwargs = {}
    for name, _, get in _plan(cls):
        if name in optional and not msg.HasField(name):
            continue
        kwargs[name] = get(getattr(msg, name))
    return cls(**kwargs)


def to_proto(obj, message_cls):
    msg = message_cls()
    _fill(msg, obj)
    return msg


def from_proto(cls: type, msg) -> Any:
    return _build(cls, msg)


def _oneof_name(cls_name: str) -> str:
    return _snake(cls_name).lower()


def encode(event: ev.Event, pool: str, trace_context: dict[str, str] | None = None) -> bytes:
    env = events_pb2.EventEnvelope(
        event_id=event.event_id, type=type(event).__name__, time=event.time,
        pool=pool, producer=event.producer, schema=LOG_SCHEMA,
    )
    if trace_context:
        env.trace_context.update(trace_context)
    _fill(getattr(env, _oneof_name(type(event).__name__)), event)
    return env.SerializeToString()


def _parse_envelope(data: bytes) -> events_pb2.EventEnvelope:
    if not data:
        raise DecodeError("empty record")
    env = events_pb2.EventEnvelope()
    try:
        env.ParseFromString(data)
    except Exception as exc:  # protobuf raises DecodeError or RuntimeError variants
        raise DecodeError(f"not an EventEnvelope: {exc}") from None
    if env.schema > LOG_SCHEMA:
        raise NewerLogSchema(env.schema, env.producer)
    return env


def decode(data: bytes) -> tuple[ev.Event, events_pb2.EventEnvelope]:
    """The domain event and its envelope; DecodeError for anything else. On the replay
    hot path the payload is checked with one ``HasField`` (WhichOneof, slower, only
    names a mismatch)."""
    env = _parse_envelope(data)
    return _built(env, _EVENT_BUILDERS, _event_builder), env


def decode_flat(data: bytes) -> tuple:
    """``flat.flatten(decode(data)[0])``, read straight from the protobuf without building
    the dataclasses (what a catch-up reader sends); the same DecodeErrors as ``decode``."""
    return _built(_parse_envelope(data), _FLAT_BUILDERS, _flat_event_builder)


def _built(env, builders: dict, make: Callable) -> Any:
    type_name = env.type
    found = builders.get(type_name)
    if found is None:
        if type_name not in ev.EVENT_TYPES:
            raise DecodeError(f"unknown event type {type_name!r}")
        found = builders[type_name] = make(ev.EVENT_TYPES[type_name])
    build, oneof = found
    if not env.event_id:
        raise DecodeError("missing event_id")
    if not env.HasField(oneof):
        raise DecodeError(f"type {type_name!r} does not match payload {env.WhichOneof('payload')!r}")
    try:
        return build(env, getattr(env, oneof))
    except (DecodeError, ValueError, KeyError) as exc:
        raise DecodeError(f"bad {type_name}: {exc}") from None


def decode_slow(data: bytes) -> tuple[ev.Event, events_pb2.EventEnvelope]:
    """``decode`` through the generic plan, field by field: the reference the generated
    builders are tested against."""
    env = _parse_envelope(data)
    cls = ev.EVENT_TYPES.get(env.type)
    if cls is None:
        raise DecodeError(f"unknown event type {env.type!r}")
    if not env.event_id:
        raise DecodeError("missing event_id")
    payload = env.WhichOneof("payload")
    if payload != _oneof_name(env.type):
        raise DecodeError(f"type {env.type!r} does not match payload {payload!r}")
    try:
        fields = {name: get(getattr(getattr(env, payload), name)) for name, _, get in _plan(cls)}
    except (DecodeError, ValueError, KeyError) as exc:
        raise DecodeError(f"bad {env.type}: {exc}") from None
    return cls(event_id=env.event_id, time=env.time, producer=env.producer, **fields), env


# --- generated builders: the replay hot path ---------------------------------------------
# Replaying a pool log decodes every record, so ``decode`` must be cheap: the generic plan
# above (a dict of getter calls, then ``cls(**fields)``) costs 10-30 us per event. For each
# class, the same conversions are compiled once into one straight-line function that
# reads each proto field and stores it in the new object's slot (``_s_job_id(o, m.job_id)``),
# skipping the conversion call where the protobuf field already yields the Python type the
# dataclass declares. Same events and the same DecodeErrors as ``decode_slow`` (the plan),
# ~3x faster (3.5 us against 9.9 us per event on a replayed pool log).
_EVENT_BUILDERS: dict[str, tuple[Callable[[Any, Any], ev.Event], str]] = {}   # type -> (builder, oneof)
_MSG_BUILDERS: dict[type, Callable[[Any], Any]] = {}

# Value classes decoded to one shared object per distinct value (see _compile), and how
# many distinct values each keeps at most.
_INTERNED = frozenset({model.GpuSlot, model.WorkerResources})
INTERN_LIMIT = 4096

_PROTO_PY = {  # FieldDescriptor.cpp_type -> the Python type upb returns for it
    1: int, 2: int, 3: int, 4: int, 5: float, 6: float, 7: bool,
}


def _field_expr(cls: type, name: str, hint: Any, fdesc, ns: dict, flat_form: bool = False) -> str:
    """Python source for field ``name`` of ``cls`` read from proto message ``m``: the
    domain value, or with ``flat_form`` its flat form (``gpusched.adapters.log.flat``)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    src = f"m.{name}"
    nested = _flat_message_builder if flat_form else _message_builder
    if origin is tuple and args and typing.get_origin(args[0]) is tuple:   # labels (a proto map)
        return f"tuple(sorted({src}.items()))"
    if origin is tuple:
        item = args[0]
        if dataclasses.is_dataclass(item):
            key = f"_b_{item.__name__}"
            ns[key] = nested(item)
            return f"tuple(map({key}, {src}))"
        return f"tuple({src})"
    if dataclasses.is_dataclass(hint):
        key = f"_b_{hint.__name__}"
        ns[key] = nested(hint)
        return f"{key}({src})"
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        # valid numbers from a table; anything else through the plan's getter, which raises
        key = f"_g_{cls.__name__}_{name}"
        get = ns[key] = _converters(name, hint)[1]
        enum_type = fdesc.enum_type
        ns[f"_t_{cls.__name__}_{name}"] = table = {}
        for value in enum_type.values:
            try:
                member = get(value.number)
            except DecodeError:
                continue
            table[value.number] = member._value_ if flat_form else member
        # a member (or its value) is a non-empty str, so truthy; the field is read once
        return f"(_t_{cls.__name__}_{name}.get(_v := {src}) or {key}(_v))"
    conv = hint_scalar(hint)
    if conv in (int, float, bool) and _PROTO_PY.get(fdesc.cpp_type) is conv:
        expr = src
    elif conv is str and fdesc.type == fdesc.TYPE_STRING:
        expr = src
    else:
        key = f"_c_{cls.__name__}_{name}"
        ns[key] = conv
        expr = f"{key}({src})"
    if flat_form and flat.shares_string(name, hint):
        ns["_share"] = flat.share_string
        expr = f"_share(_v := {expr}, _v)"
    return expr


def _compile(cls: type, header: str, head_args: list[str], msg_desc, optional: set[str],
             intern: bool = True) -> Callable:
    hints = typing.get_type_hints(cls, vars(model) | vars(ev))
    ns: dict[str, Any] = {"_cls": cls}
    args = list(head_args)
    for f in dataclasses.fields(cls):
        if f.name in _ENVELOPE_FIELDS and issubclass(cls, ev.Event):
            continue
        expr = _field_expr(cls, f.name, hints[f.name], msg_desc.fields_by_name[f.name], ns)
        if f.name in optional:   # unset on the wire: the dataclass default, as _build does
            ns[f"_d_{f.name}"], factory = _unset_default(cls, f)
            expr = f"({expr} if m.HasField({f.name!r}) else _d_{f.name}{'()' if factory else ''})"
        args.append(f"{f.name}={expr}")
    if intern and cls in _INTERNED:
        # A small value that repeats across events (GPU slots, worker shapes): one shared
        # object per distinct value, found by its fields. Saves building it again (about
        # half the cost), and the memory of a copy per event kept in the state.
        ns["_cache"] = {}
        ns["_limit"] = INTERN_LIMIT
        ns["_make"] = _compile(cls, header, head_args, msg_desc, optional, intern=False)
        exprs = [arg.split("=", 1)[1] for arg in args]
        source = (f"def build({header}):\n"
                  f"    key = ({', '.join(exprs)},)\n"
                  f"    o = _cache.get(key)\n"
                  f"    if o is None:\n"
                  f"        o = _make({header})\n"
                  f"        if len(_cache) < _limit:   # bounded whatever the log holds\n"
                  f"            _cache[key] = o\n"
                  f"    return o\n")
    elif _plain_slots_dataclass(cls):
        # Set the slots directly: what the generated __init__ does for a frozen dataclass,
        # without its keyword-argument call (about 3x cheaper for a 7-field event).
        ns["_new"] = object.__new__
        lines = ["    o = _new(_cls)"]
        for arg in args:
            name, expr = arg.split("=", 1)
            ns[f"_s_{name}"] = getattr(cls, name).__set__
            lines.append(f"    _s_{name}(o, {expr})")
        source = f"def build({header}):\n" + "\n".join(lines) + "\n    return o\n"
    else:
        source = f"def build({header}):\n    return _cls({', '.join(args)})\n"
    exec(compile(source, f"<codec builder {cls.__name__}>", "exec"), ns)
    return ns["build"]


def _unset_default(cls: type, f: dataclasses.Field) -> tuple[Any, bool]:
    """What a field declared ``optional`` in proto takes when unset on the wire: the
    dataclass default, or its factory (and True)."""
    if f.default is not dataclasses.MISSING:
        return f.default, False
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory, True
    raise TypeError(f"{cls.__name__}.{f.name}: optional on the wire but required here")


def _plain_slots_dataclass(cls: type) -> bool:
    """A slotted dataclass whose __init__ only stores its arguments: building it slot by
    slot gives the same object."""
    fields = dataclasses.fields(cls)
    return (
        "__slots__" in cls.__dict__ and not hasattr(cls, "__post_init__")
        and getattr(getattr(cls.__init__, "__code__", None), "co_filename", "") == "<string>"   # generated
        and all(f.init for f in fields)
        and {f.name for f in fields} == {n for c in cls.__mro__ for n in c.__dict__.get("__slots__", ())}
    )


_WIRE_NAMES = {"JobSpec": "JobSpecRecord", "ServiceSpec": "ServiceSpecRecord", "UpdateStrategy": "UpdateStrategyRecord"}
# the API's JobSpec, ServiceSpec and UpdateStrategy are not the layouts logs hold


def _message_builder(cls: type) -> Callable[[Any], Any]:
    build = _MSG_BUILDERS.get(cls)
    if build is None:
        desc = getattr(types_pb2, _WIRE_NAMES.get(cls.__name__, cls.__name__)).DESCRIPTOR
        build = _MSG_BUILDERS[cls] = _compile(cls, "m", [], desc, _optional_fields(desc))
    return build


# --- flat builders: the catch-up reader's hot path ----------------------------------------
# The same reads, compiled into one tuple display per class: the flat form an event takes
# to the folding process, without the dataclasses a reader would build only to take apart.
_FLAT_BUILDERS: dict[str, tuple[Callable[[Any, Any], tuple], str]] = {}   # type -> (builder, oneof)
_FLAT_MSG_BUILDERS: dict[type, Callable[[Any], tuple]] = {}
_FLAT_ENVELOPE = {"event_id": "env.event_id", "time": "env.time", "producer": "_share(_v := env.producer, _v)"}


def _compile_flat(cls: type, header: str, msg_desc, optional: set[str]) -> Callable:
    hints = typing.get_type_hints(cls, vars(model) | vars(ev))
    ns: dict[str, Any] = {"_share": flat.share_string}
    event = issubclass(cls, ev.Event)
    parts = [str(flat.EVENT_CLASSES.index(cls))] if event else []
    for f in dataclasses.fields(cls):
        if event and f.name in _ENVELOPE_FIELDS:
            parts.append(_FLAT_ENVELOPE[f.name])
            continue
        expr = _field_expr(cls, f.name, hints[f.name], msg_desc.fields_by_name[f.name], ns, flat_form=True)
        if f.name in optional:   # unset on the wire: the flat form of the dataclass default
            default, factory = _unset_default(cls, f)
            ns[f"_d_{f.name}"] = flat.flatten_value(default() if factory else default)
            expr = f"({expr} if m.HasField({f.name!r}) else _d_{f.name})"
        parts.append(expr)
    source = f"def build({header}):\n    return ({', '.join(parts)},)\n"
    exec(compile(source, f"<codec flat builder {cls.__name__}>", "exec"), ns)
    return ns["build"]


def _flat_message_builder(cls: type) -> Callable[[Any], tuple]:
    build = _FLAT_MSG_BUILDERS.get(cls)
    if build is None:
        desc = getattr(types_pb2, _WIRE_NAMES.get(cls.__name__, cls.__name__)).DESCRIPTOR
        build = _FLAT_MSG_BUILDERS[cls] = _compile_flat(cls, "m", desc, _optional_fields(desc))
    return build


def _flat_event_builder(cls: type) -> tuple[Callable[[Any, Any], tuple], str]:
    oneof = _oneof_name(cls.__name__)
    desc = events_pb2.EventEnvelope.DESCRIPTOR.fields_by_name[oneof].message_type
    return _compile_flat(cls, "env, m", desc, set()), oneof


def _event_builder(cls: type) -> tuple[Callable[[Any, Any], ev.Event], str]:
    oneof = _oneof_name(cls.__name__)
    desc = events_pb2.EventEnvelope.DESCRIPTOR.fields_by_name[oneof].message_type
    build = _compile(cls, "env, m", ["event_id=env.event_id", "time=env.time", "producer=env.producer"],
                     desc, set())
    return build, oneof
