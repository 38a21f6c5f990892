"""Domain events <-> the protobuf ``EventEnvelope`` on the wire.

Domain dataclasses and protobuf messages use the same field names, so one conversion
plan per class, built once from the dataclass's type hints, serves every event type:
nested dataclasses map to messages, tuples to repeated fields, enums to the prefixed
proto enum values (``JobPhase.RUNNING`` <-> ``JOB_PHASE_RUNNING``), and node labels to
a proto map. A new event needs its dataclass, its proto message and a line in
``EVENT_TYPES``; nothing here.
"""
from __future__ import annotations

import dataclasses
import enum
import re
import typing
from functools import cache
from typing import Any, Callable

from gpusched.core import events as ev
from gpusched.core import model
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
        names = _OPTIONAL_CACHE[desc] = {
            f.name for f in desc.fields if f.containing_oneof is not None and f.containing_oneof.name.startswith("_")
        }
    return names


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
        pool=pool, producer=event.producer,
    )
    if trace_context:
        env.trace_context.update(trace_context)
    _fill(getattr(env, _oneof_name(type(event).__name__)), event)
    return env.SerializeToString()


def decode(data: bytes) -> tuple[ev.Event, events_pb2.EventEnvelope]:
    """The domain event and its envelope; DecodeError for anything else."""
    if not data:
        raise DecodeError("empty record")
    env = events_pb2.EventEnvelope()
    try:
        env.ParseFromString(data)
    except Exception as exc:  # protobuf raises DecodeError or RuntimeError variants
        raise DecodeError(f"not an EventEnvelope: {exc}") from None
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
