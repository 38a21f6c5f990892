"""Domain events <-> plain nested tuples, the form events take between two processes.

A parallel replay (``gpusched.adapters.log.catchup``) decodes records in a reader process and
hands the events to the process that folds them. Pickling the dataclasses would cost about
as much to load as decoding the protobuf again (4.3 us against 5.0 us per event,
measured), so events cross as tuples of str/int/float/bool, pickled a frame at a time
(``marshal`` loads them 2-3x slower: it builds every string anew), and are rebuilt here by straight-line functions compiled once per class, as
``codec`` compiles its protobuf builders.

An event flattens to ``(type code, field, field, ...)`` with its dataclass fields in
declaration order; a nested value object to the tuple of its fields; a tuple of value
objects to a tuple of those; an enum member to its value. ``unflatten(flatten(e)) == e``
for every event (tested by hypothesis). GPU slots and worker shapes come back as one
shared object per distinct value, as ``codec`` decodes them.

Strings other than event ids (job ids, node, team and producer names, which recur across
a job's events) flatten to one object per distinct value until ``forget_strings()``: a
frame of events pickled together then holds each once, and the loading side builds each
once (0.5 against 1.1 us per event to load, measured on a replayed pool log).
"""
from __future__ import annotations

import dataclasses
import enum
import typing
from typing import Any, Callable

from gpusched.core import events as ev
from gpusched.core import model

# Type codes are positions in this tuple: both processes run the same code.
EVENT_CLASSES: tuple[type[ev.Event], ...] = tuple(ev.EVENT_TYPES.values())
_CODES = {cls: code for code, cls in enumerate(EVENT_CLASSES)}
# Negative codes are records that are no event: -1 did not decode (-1, reason, key, value);
# NEWER_SCHEMA is of a newer log schema (NEWER_SCHEMA, schema, producer), which stops the folder.
NEWER_SCHEMA = -2

_INTERNED = frozenset({model.GpuSlot, model.WorkerResources})
INTERN_LIMIT = 4096


class _Kind(enum.Enum):
    STR = "str"              # shared through the string memo
    PLAIN = "plain"          # int, float, bool, event ids, tuples of those, labels: as they are
    VALUE = "value"          # a nested value object
    VALUES = "values"        # a tuple of value objects
    ENUM = "enum"


def _field_kinds(cls: type) -> list[tuple[str, _Kind, Any]]:
    hints = typing.get_type_hints(cls, vars(model) | vars(ev))
    kinds = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if dataclasses.is_dataclass(hint):
            kinds.append((f.name, _Kind.VALUE, hint))
        elif origin is tuple and args and dataclasses.is_dataclass(args[0]):
            kinds.append((f.name, _Kind.VALUES, args[0]))
        elif isinstance(hint, type) and issubclass(hint, enum.Enum):
            kinds.append((f.name, _Kind.ENUM, hint))
        elif shares_string(f.name, hint):
            kinds.append((f.name, _Kind.STR, None))
        else:
            kinds.append((f.name, _Kind.PLAIN, None))
    return kinds


def _compile(name: str, source: str, ns: dict) -> Callable:
    exec(compile(source, f"<flat {name}>", "exec"), ns)
    return ns["fn"]


_FLATTENERS: dict[type, Callable[[Any], tuple]] = {}
_STRINGS: dict[str, str] = {}
share_string = _STRINGS.setdefault   # share_string(s, s): the memo's object equal to s


def shares_string(name: str, hint: Any) -> bool:
    """Whether a field goes through the string memo: every str but event ids (unique)."""
    return hint is str and name != "event_id"


def forget_strings() -> None:
    """Start a new string memo (after each frame: it only has to span one pickle)."""
    _STRINGS.clear()


_BUILDERS: dict[type, Callable[[tuple], Any]] = {}


def _flattener(cls: type) -> Callable[[Any], tuple]:
    fn = _FLATTENERS.get(cls)
    if fn is not None:
        return fn
    ns: dict[str, Any] = {"_share": share_string}
    parts = [] if cls not in _CODES else [str(_CODES[cls])]
    for name, kind, sub in _field_kinds(cls):
        if kind is _Kind.VALUE:
            ns[f"_f_{name}"] = _flattener(sub)
            parts.append(f"_f_{name}(o.{name})")
        elif kind is _Kind.VALUES:
            ns[f"_f_{name}"] = _flattener(sub)
            parts.append(f"tuple(map(_f_{name}, o.{name}))")
        elif kind is _Kind.ENUM:
            parts.append(f"o.{name}._value_")
        elif kind is _Kind.STR:
            parts.append(f"_share(_v := o.{name}, _v)")
        else:
            parts.append(f"o.{name}")
    fn = _FLATTENERS[cls] = _compile(cls.__name__, f"def fn(o):\n    return ({', '.join(parts)},)\n", ns)
    return fn


def _builder(cls: type) -> Callable[[tuple], Any]:
    """Rebuild ``cls`` from its flat tuple ``t`` slot by slot: what the generated __init__
    of a frozen slotted dataclass does, without its keyword-argument call."""
    fn = _BUILDERS.get(cls)
    if fn is not None:
        return fn
    ns: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    first = 1 if cls in _CODES else 0
    lines = ["    o = _new(_cls)"]
    for i, (name, kind, sub) in enumerate(_field_kinds(cls), start=first):
        ns[f"_s_{name}"] = getattr(cls, name).__set__
        if kind is _Kind.VALUE:
            ns[f"_b_{name}"] = _builder(sub)
            expr = f"_b_{name}(t[{i}])"
        elif kind is _Kind.VALUES:
            ns[f"_b_{name}"] = _builder(sub)
            expr = f"tuple(map(_b_{name}, t[{i}]))"
        elif kind is _Kind.ENUM:
            ns[f"_e_{name}"] = {m.value: m for m in sub}
            expr = f"_e_{name}[t[{i}]]"
        else:
            expr = f"t[{i}]"
        lines.append(f"    _s_{name}(o, {expr})")
    source = "def fn(t):\n" + "\n".join(lines) + "\n    return o\n"
    if cls in _INTERNED:
        # the flat tuple is hashable, so it is the cache key itself
        ns["_make"] = _compile(cls.__name__, source, dict(ns))
        ns["_cache"] = {}
        ns["_limit"] = INTERN_LIMIT
        source = ("def fn(t):\n"
                  "    o = _cache.get(t)\n"
                  "    if o is None:\n"
                  "        o = _make(t)\n"
                  "        if len(_cache) < _limit:   # bounded whatever the log holds\n"
                  "            _cache[t] = o\n"
                  "    return o\n")
    fn = _BUILDERS[cls] = _compile(cls.__name__, source, ns)
    return fn


def _check_plain_slots(cls: type) -> None:
    """Building slot by slot is only the same object for a plain slotted dataclass."""
    fields = {f.name for f in dataclasses.fields(cls)}
    slots = {n for c in cls.__mro__ for n in c.__dict__.get("__slots__", ())}
    if fields != slots or hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} is not a plain slotted dataclass")
    for _, kind, sub in _field_kinds(cls):
        if kind in (_Kind.VALUE, _Kind.VALUES):
            _check_plain_slots(sub)


for _cls in EVENT_CLASSES:
    _check_plain_slots(_cls)

_FLATTEN_BY_CLASS = {cls: _flattener(cls) for cls in EVENT_CLASSES}
BUILD_BY_CODE = tuple(_builder(cls) for cls in EVENT_CLASSES)


def flatten(event: ev.Event) -> tuple:
    return _FLATTEN_BY_CLASS[type(event)](event)


def flatten_value(value: Any) -> Any:
    """The flat form of any field value: a value object, a tuple of them, an enum member,
    or a plain value."""
    if dataclasses.is_dataclass(value):
        return _flattener(type(value))(value)
    if isinstance(value, enum.Enum):
        return value._value_
    if type(value) is tuple and value and dataclasses.is_dataclass(value[0]):
        return tuple(map(flatten_value, value))
    return value


def unflatten(flat: tuple) -> ev.Event:
    return BUILD_BY_CODE[flat[0]](flat)

