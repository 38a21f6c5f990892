"""Snapshots of a ``ClusterState``: portable, versioned bytes and back.

A snapshot lets a replica resume a pool log from ``state.offset + 1`` instead of offset 0
(docs/design/architecture.md section 4). The bytes travel through a Kafka topic any client of the
cluster can write to, so they are data, never code: compact JSON compressed with zlib,
behind a magic number and a format version — no pickle.

Layout: ``MAGIC`` (4 bytes) + format version (1 byte) + zlib(JSON document). zlib's
Adler-32 catches corruption; the document is checked for shape and types while the state
is rebuilt, and anything wrong raises ``SnapshotError``.

The document is *columnar* and derived from the dataclasses' type hints (like the event
codec): a list of N dataclass instances is one JSON object with a column (a list of N
values) per field; nested dataclasses are nested column objects; a sequence or dict per
instance is its lengths plus the flattened items (or keys and values) as columns; enums are
their values, sets sorted. So *every* field of the state is covered — nodes, GPUs, jobs,
specs, pending order, usage, idempotency map, nominations, the dedupe window (size and
ids in order), counters (``applied``, ``rejected``, ``next_seq``, ``offset``,
``version``) — and a field added later is covered without touching this file. One
exception (``_WRITTEN_AS``): of the reducer's journal of changed jobs
(``ClusterState.changes``, up to ``CHANGES_KEPT`` ids) only where it ends is written, as
``changes_base``. Its readers keep positions beside one state object in one process
(``gpusched.policies.touched_nodes``), so no reader of a restored state could use the
entries; a restored journal starts empty at that position, and a reader holding an
earlier position is told to rebuild (``ClusterState.changes_since`` gives None). Columns
keep restore fast (instances are built with ``map(cls, *columns)``, type checks run per
column) and compress well (like values sit together).

The document names the fields of each dataclass (``schema``): a snapshot written before a
field was added restores with that field's default; one with a field this code does not
know is refused (written by newer code: replaying the log is the safe answer).

Numbers go in bulk: a column of at least ``_PACK_MIN`` floats (or of ints that fit in 64
bits) is written as one base64 string of little-endian doubles (int64s), so a million
timestamps are parsed by ``struct`` instead of JSON, bit for bit.

Writing is split so a service can copy the state consistently on its event loop and do
the expensive part elsewhere: ``capture`` (synchronous, reads the live state; copies what
is mutable — sets, dicts, the mutable dataclasses' fields — and only references what is
immutable: strings, numbers, enums, frozen dataclasses, tuples of them) then
``encode_captured`` (turns the capture into JSON + zlib; reads no live state, so it may run
in a thread). ``snapshot_bytes`` does both; ``snapshot_doc`` gives the JSON document.

This module only encodes and decodes. Where it runs (a thread, a forked child) and what
the cyclic GC does meanwhile is the caller's choice (``gpusched.adapters.log.snapshots``,
``restore``, ``forked_snapshot``). The codec of every column is built when the module is
imported, so capture and encode may run on two threads at once.
"""
from __future__ import annotations

import base64
import dataclasses
import enum
import json
import struct
import types
import typing
import zlib
from collections import deque
from itertools import islice, repeat
from operator import attrgetter
from typing import Any, Callable

from gpusched.core.model import JobPhase
from gpusched.core.state import ClusterState, DedupeWindow, JobState, recount_pending
from gpusched.native import field_hints

MAGIC = b"GSNP"
FORMAT_VERSION = 1
# A snapshot inflating beyond this is refused: a zip bomb on a shared topic must not take
# the replica's memory. (A million-event pool state is ~60 MB of JSON.)
MAX_INFLATED = 2 * 1024 ** 3


class SnapshotError(ValueError):
    """Bytes that are not a snapshot this code can restore (corrupt, foreign or newer)."""


# --- writing ------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class Captured:
    """A consistent copy of one state, ready to be encoded anywhere (see ``capture``)."""

    data: Any
    offset: int
    jobs: int


def capture(state: ClusterState) -> Captured:
    """The part of snapshotting that must see the live state: fast, on the caller's thread."""
    return Captured(_column(ClusterState).capture([state]), state.offset, len(state.jobs))


def encode_captured(captured: Captured, level: int = 1) -> bytes:
    """The snapshot bytes of a capture; reads no live state, so it may run in a thread.
    zlib level 1: about 3x faster than the default level for ~10% more bytes."""
    return encode_doc(_document(captured), level)


def snapshot_bytes(state: ClusterState, level: int = 1) -> bytes:
    return encode_captured(capture(state), level)


def snapshot_doc(state: ClusterState) -> dict:
    """The JSON document of a snapshot of ``state`` (what ``snapshot_bytes`` compresses)."""
    return _document(capture(state))


def _document(captured: Captured) -> dict:
    return {"v": FORMAT_VERSION, "schema": _schema(), "state": _column(ClusterState).render(captured.data)}


def encode_doc(doc: dict, level: int = 1) -> bytes:
    blob = json.dumps(doc, separators=(",", ":"), ensure_ascii=False, check_circular=False).encode()
    return MAGIC + bytes([FORMAT_VERSION]) + zlib.compress(blob, level)


# --- reading ------------------------------------------------------------------------
def state_from_snapshot(data: bytes) -> ClusterState:
    """The state ``data`` was taken from; ``SnapshotError`` if it is not a valid snapshot."""
    doc = _load(data)
    try:
        schema = doc["schema"]
        if type(schema) is not dict:
            raise SnapshotError("malformed snapshot: schema")
        state = _column(ClusterState).decoder(schema)(doc["state"], 1)[0]
    except SnapshotError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, struct.error) as exc:
        raise SnapshotError(f"malformed snapshot: {type(exc).__name__}: {exc}") from None
    del doc
    _check_consistent(state)
    # A snapshot written before the journal was left out carries its entries: dropped, so
    # that every restored journal starts empty where the snapshotted one ended.
    state.changes_base, state.changes = state.changes_end(), []
    state.node_changes_base, state.node_changes = state.node_changes_end(), []
    recount_pending(state)
    return state


def _load(data: bytes) -> dict:
    if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) < len(MAGIC) + 1:
        raise SnapshotError("not a snapshot: too short")
    data = bytes(data)
    if data[:len(MAGIC)] != MAGIC:
        raise SnapshotError("not a snapshot: bad magic")
    version = data[len(MAGIC)]
    if version != FORMAT_VERSION:
        raise SnapshotError(f"unsupported snapshot format version {version} (this code reads {FORMAT_VERSION})")
    inflater = zlib.decompressobj()
    try:
        blob = inflater.decompress(data[len(MAGIC) + 1:], MAX_INFLATED)
        if inflater.unconsumed_tail:
            raise SnapshotError(f"snapshot inflates beyond {MAX_INFLATED} bytes")
        blob += inflater.flush()
    except zlib.error as exc:
        raise SnapshotError(f"corrupt snapshot (zlib): {exc}") from None
    if not inflater.eof or inflater.unused_data:
        raise SnapshotError("corrupt snapshot: truncated or trailing data")
    try:
        doc = json.loads(blob)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SnapshotError(f"corrupt snapshot (json): {exc}") from None
    if type(doc) is not dict or doc.get("v") != FORMAT_VERSION:
        raise SnapshotError("corrupt snapshot: document version does not match its header")
    return doc


_HOLDING = frozenset(p for p in JobPhase if p.holds_gpus)


def _check_consistent(state: ClusterState) -> None:
    """Cross-references the reducer relies on (it indexes by them without checking)."""
    jobs, nodes = state.jobs, state.nodes
    if not all(map(str.__eq__, jobs, map(attrgetter("job_id"), jobs.values()))):
        raise SnapshotError("malformed snapshot: a job is filed under another id")
    if not all(map(str.__eq__, nodes, map(attrgetter("info.name"), nodes.values()))):
        raise SnapshotError("malformed snapshot: a node is filed under another name")
    for job_id, job in jobs.items():
        if job.phase in _HOLDING:
            for w in job.workers:
                node = nodes.get(w.node)
                if node is None or any(not 0 <= s.index < len(node.gpus) for s in w.gpus):
                    raise SnapshotError(f"malformed snapshot: job {job_id} holds GPUs on an unknown node or GPU")
    known = jobs.keys()
    for name, node in nodes.items():
        if not known >= node.jobs:
            raise SnapshotError(f"malformed snapshot: node {name} runs an unknown job")
    if not state.pending.keys() <= jobs.keys():
        raise SnapshotError("malformed snapshot: a pending job is unknown")


# --- columns: a list of values of one type <-> JSON, driven by type hints --------------
# For each type hint a ``Column``: ``capture(values)`` copies a list of values of that type
# (on the loop: mutable parts copied, immutable ones referenced), ``render(captured)``
# turns that into JSON (anywhere), ``decoder(schema)(json, n)`` gives the n values back.
Decode = Callable[[Any, int], list]

_SCALARS: dict[Any, tuple[type, ...]] = {
    int: (int,), float: (int, float), str: (str,), bool: (bool,),
    type(None): (type(None),), None: (type(None),),
}


def _bad(what: str, value: Any = "") -> SnapshotError:
    return SnapshotError(f"malformed snapshot: bad {what} {str(value)[:200]}".rstrip())


def _expect_list(col: Any, n: int, what: str) -> list:
    if type(col) is not list or len(col) != n:
        raise _bad(f"{what} column (expected {n} values)", "" if type(col) is list else col)
    return col


def _ident(values: list) -> list:
    return values


@dataclasses.dataclass(slots=True)
class Column:
    capture: Callable[[list], Any]
    render: Callable[[Any], Any]
    decoder: Callable[[dict], Decode]
    immutable: bool


# Fields written otherwise than as they are: (class, field) -> what is written instead,
# computed from the instance, or None for nothing (it restores with its default).
_WRITTEN_AS: dict[tuple[type, str], Callable[[Any], Any] | None] = {
    (ClusterState, "changes"): None,
    (ClusterState, "changes_base"): ClusterState.changes_end,
    (ClusterState, "node_changes"): None,
    (ClusterState, "node_changes_base"): ClusterState.node_changes_end,
    (ClusterState, "pending_counts"): None,   # rebuilt from the pending jobs (recount_pending)
    (JobState, "pending_key"): None,          # built again where counted (count_pending)
}

# Fields this code no longer has, which a snapshot written before may carry: read past.
_RETIRED: dict[type, frozenset[str]] = {ClusterState: frozenset({"nodes_version"})}

_COLUMNS: dict[Any, Column] = {}
_CLASSES: dict[type, tuple[str, ...]] = {}   # dataclasses met, in order: the schema


def _column(hint: Any, where: str = "") -> Column:
    key = hint if isinstance(hint, type) else repr(hint)
    found = _COLUMNS.get(key)
    if found is None:
        found = _COLUMNS[key] = _build_column(hint, where or getattr(hint, "__name__", repr(hint)))
    return found


def _schema() -> dict[str, list[str]]:
    _column(ClusterState)   # meets every dataclass reachable from the state
    return {cls.__name__: list(names) for cls, names in _CLASSES.items()}


def _build_column(hint: Any, where: str) -> Column:
    if hint is str:
        return _deduplicated(_scalar_column(_SCALARS[str], where), where)
    if hint in (int, float):
        return _packed(_scalar_column(_SCALARS[hint], where), hint, where)
    if hint in _SCALARS:
        return _scalar_column(_SCALARS[hint], where)
    if hint is DedupeWindow:
        return _dedupe_column()
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _deduplicated(_enum_column(hint), where)
    if dataclasses.is_dataclass(hint):
        column = _dataclass_column(hint)
        return _deduplicated(column, where) if column.immutable else column
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        return _fixed_tuple_column(args, where)
    if origin in (tuple, list, set, frozenset) and args:
        column = _sequence_column(origin, args[0], where)
        return _deduplicated(column, where) if column.immutable else column
    if origin is dict and args:
        return _dict_column(args[0], args[1], where)
    if origin in (typing.Union, types.UnionType):
        raise TypeError(f"{where}: no snapshot encoding for union {hint!r}")
    raise TypeError(f"{where}: no snapshot encoding for {hint!r}")


def _scalar_column(allowed: tuple[type, ...], where: str) -> Column:
    def decode(col: Any, n: int) -> list:
        _expect_list(col, n, where)
        if not all(map(isinstance, col, repeat(allowed))):
            raise _bad(where, next(v for v in col if not isinstance(v, allowed)))
        return col
    return Column(_ident, _ident, lambda schema: decode, True)


# Numbers in bulk: one base64 string of packed little-endian numbers per column, exact:
# doubles, or the narrowest signed integer that holds the column ("$f8", "$i1".."$i8").
_PACK_MIN = 64
_INT_WIDTHS = (("$i1", "b", 2 ** 7), ("$i2", "h", 2 ** 15), ("$i4", "i", 2 ** 31), ("$i8", "q", 2 ** 63))
_PACK_CODES = {"$f8": ("d", 8), **{key: (code, struct.calcsize(code)) for key, code, _ in _INT_WIDTHS}}


def _packed(column: Column, hint: type, where: str) -> Column:
    def render(values: list) -> Any:
        n = len(values)
        if n >= _PACK_MIN and set(map(type, values)) == {hint}:
            if hint is float:
                key, code = "$f8", "d"
            else:
                low, high = min(values), max(values)
                key, code = next(((k, c) for k, c, limit in _INT_WIDTHS if -limit <= low and high < limit),
                                 (None, None))
            if key is not None:
                return {key: base64.b64encode(struct.pack(f"<{n}{code}", *values)).decode("ascii")}
        return column.render(values)

    allowed = ("$f8",) if hint is float else tuple(k for k, _, _ in _INT_WIDTHS)

    def make(schema: dict) -> Decode:
        plain = column.decoder(schema)

        def decode(col: Any, n: int) -> list:
            if type(col) is dict:
                if len(col) != 1:
                    raise _bad(where)
                ((key, text),) = col.items()
                if key not in allowed or type(text) is not str:
                    raise _bad(where)
                code, size = _PACK_CODES[key]
                raw = base64.b64decode(text, validate=True)
                if len(raw) != size * n:
                    raise _bad(f"{where} (packed length)")
                return list(struct.unpack(f"<{n}{code}", raw))
            return plain(col, n)
        return decode
    return Column(column.capture, render, make, True)


# Immutable values repeat a lot (team and node names, GPU slots, worker shapes): such a
# column is written as its distinct values plus one index per value, so it is smaller and
# restores each distinct value once, shared (safe: they are immutable, as in a live state,
# which shares them with the events they came from).
_DEDUPE_MIN = 64        # shorter columns are written as they are
_DEDUPE_SAMPLE = 256    # values looked at to decide
_DEDUPE_RATIO = 0.5     # at most this share of distinct values in the sample
_INDEXES = _packed(_scalar_column((int,), "indexes"), int, "indexes")
_INDEX_DECODE = _INDEXES.decoder({})


def _deduplicated(column: Column, where: str) -> Column:
    def render(values: list) -> Any:
        n = len(values)
        if n >= _DEDUPE_MIN:
            sample = values[::max(1, n // _DEDUPE_SAMPLE)]
            if len(set(sample)) <= _DEDUPE_RATIO * len(sample):
                uniques = list(dict.fromkeys(values))
                position = {v: i for i, v in enumerate(uniques)}
                idx = list(map(position.__getitem__, values))
                return {"$n": len(uniques), "$u": column.render(uniques), "$i": _INDEXES.render(idx)}
        return column.render(values)

    def make(schema: dict) -> Decode:
        decode = column.decoder(schema)
        indexes = _INDEXES.decoder(schema)

        def decode_dedup(col: Any, n: int) -> list:
            if type(col) is dict and "$i" in col:
                m = col.get("$n")
                if type(m) is not int or m < 0 or len(col) != 3:
                    raise _bad(where)
                idx = indexes(col["$i"], n)
                uniques = decode(col.get("$u"), m)
                if idx and (min(idx) < 0 or max(idx) >= m):
                    raise _bad(f"{where} indexes")
                return list(map(uniques.__getitem__, idx))
            return decode(col, n)
        return decode_dedup
    return Column(column.capture, render, make, column.immutable)


def _enum_column(cls: type[enum.Enum]) -> Column:
    members = {m.value: m for m in cls}
    value = attrgetter("value")

    def decode(col: Any, n: int) -> list:
        _expect_list(col, n, cls.__name__)
        try:
            return list(map(members.__getitem__, col))
        except (KeyError, TypeError):
            raise _bad(cls.__name__, next(v for v in col if v not in members)) from None
    return Column(_ident, lambda values: list(map(value, values)), lambda schema: decode, True)


def _dataclass_column(cls: type) -> Column:
    every = dataclasses.fields(cls)
    if any(not f.init or f.kw_only for f in every):
        raise TypeError(f"{cls.__name__}: snapshots build dataclasses from positional fields only")
    known = tuple(f.name for f in every)
    hints = field_hints(cls)   # typing.get_type_hints, also for a class compiled by mypyc
    # Every field can be read (a snapshot from before a field was left out has it); only
    # these are written.
    fields = [f for f in every if _WRITTEN_AS.get((cls, f.name), attrgetter(f.name)) is not None]
    names = tuple(f.name for f in fields)
    _CLASSES.setdefault(cls, names)
    # A left-out field's reader is built only for a snapshot that has it (one written
    # before it was left out): a field never written needs no encoding.
    def reader(name: str) -> Column:
        return _column(hints[name], f"{cls.__name__}.{name}")
    parts = [reader(name) for name in names]
    immutable = cls.__dataclass_params__.frozen and all(p.immutable for p in parts)
    get = _row_getter(cls, names)

    def columns(values: list) -> list:
        if not values:
            return [[] for _ in names]
        return [list(col) for col in zip(*map(get, values))]

    def capture(values: list) -> Any:
        if immutable:
            return values
        return [p.capture(col) for p, col in zip(parts, columns(values))]

    def render(captured: Any) -> dict:
        cols = columns(captured) if immutable else captured
        return {name: p.render(p.capture(c) if immutable else c) for name, p, c in zip(names, parts, cols)}

    def make_decoder(schema: dict) -> Decode:
        written = schema.get(cls.__name__)
        if type(written) is not list or not all(type(n) is str for n in written):
            raise SnapshotError(f"malformed snapshot: no field list for {cls.__name__}")
        unknown = [n for n in written if n not in known and n not in _RETIRED.get(cls, ())]
        if unknown or len(set(written)) != len(written):
            raise SnapshotError(f"snapshot has fields of {cls.__name__} this code does not know: {unknown} "
                                "(written by newer code?)")
        plan = []
        for f in every:
            if f.name in written:
                plan.append((f.name, reader(f.name).decoder(schema), None))
            elif f.default is not dataclasses.MISSING:
                plan.append((f.name, None, lambda n, d=f.default: [d] * n))
            elif f.default_factory is not dataclasses.MISSING:
                plan.append((f.name, None, lambda n, make=f.default_factory: [make() for _ in range(n)]))
            else:
                raise SnapshotError(f"snapshot lacks {cls.__name__}.{f.name}, which has no default")

        def decode(col: Any, n: int) -> list:
            if type(col) is not dict or len(col) != len(written):
                raise _bad(f"{cls.__name__} columns")
            cols = [dec(col[name], n) if dec is not None else fill(n) for name, dec, fill in plan]
            return list(map(cls, *cols)) if cols else [cls() for _ in range(n)]
        return decode
    return Column(capture, render, make_decoder, immutable)


def _row_getter(cls: type, names: tuple[str, ...]) -> Callable[[Any], tuple]:
    """The values an instance writes, one per field of ``names``, as a tuple."""
    if any((cls, name) in _WRITTEN_AS for name in names):
        getters = [_WRITTEN_AS.get((cls, name)) or attrgetter(name) for name in names]
        return lambda value: tuple(g(value) for g in getters)
    if len(names) > 1:
        return attrgetter(*names)
    one = attrgetter(*names)
    return lambda value: (one(value),)


def _counts(col: Any, n: int, what: str) -> tuple[list[int], int]:
    counts = _INDEX_DECODE(col, n)
    if counts and min(counts) < 0:
        raise _bad(f"{what} lengths")
    return counts, sum(counts)


def _split(items: list, counts: list[int], build: Callable) -> list:
    it = iter(items)
    return [build(islice(it, c)) for c in counts]


def _sequence_column(origin: type, item: Any, where: str) -> Column:
    """Per value a sequence: its length, then every item of every value as one column."""
    part = _column(item, f"{where}[]")
    build = {tuple: tuple, list: list, set: set, frozenset: frozenset}[origin]
    ordered = origin in (set, frozenset)
    immutable = origin in (tuple, frozenset) and part.immutable

    def flatten(values: list) -> tuple[list, list]:
        if ordered:
            values = [sorted(v) for v in values]
        return list(map(len, values)), [x for v in values for x in v]

    def capture(values: list) -> Any:
        if immutable:
            return values
        counts, items = flatten(values)
        return counts, part.capture(items)

    def render(captured: Any) -> dict:
        if immutable:
            counts, items = flatten(captured)
            items = part.capture(items)
        else:
            counts, items = captured
        return {"n": _INDEXES.render(counts), "items": part.render(items)}

    def make_decoder(schema: dict) -> Decode:
        item_dec = part.decoder(schema)

        def decode(col: Any, n: int) -> list:
            if type(col) is not dict or len(col) != 2:
                raise _bad(where)
            counts, total = _counts(col.get("n"), n, where)
            return _split(item_dec(col.get("items"), total), counts, build)
        return decode
    return Column(capture, render, make_decoder, immutable)


def _dict_column(key: Any, value: Any, where: str) -> Column:
    """Per value a dict: its length, then all keys and all values as two columns (order kept)."""
    kpart, vpart = _column(key, f"{where}{{key}}"), _column(value, f"{where}{{}}")

    def capture(values: list) -> Any:
        return (list(map(len, values)), kpart.capture([k for d in values for k in d]),
                vpart.capture([x for d in values for x in d.values()]))

    def render(captured: Any) -> dict:
        counts, keys, vals = captured
        return {"n": _INDEXES.render(counts), "k": kpart.render(keys), "v": vpart.render(vals)}

    def make_decoder(schema: dict) -> Decode:
        k_dec, v_dec = kpart.decoder(schema), vpart.decoder(schema)

        def decode(col: Any, n: int) -> list:
            if type(col) is not dict or len(col) != 3:
                raise _bad(where)
            counts, total = _counts(col.get("n"), n, where)
            keys, vals = k_dec(col.get("k"), total), v_dec(col.get("v"), total)
            ki, vi = iter(keys), iter(vals)
            out = [dict(zip(islice(ki, c), islice(vi, c))) for c in counts]
            if sum(map(len, out)) != total:
                raise _bad(f"{where} (repeated keys)")
            return out
        return decode
    return Column(capture, render, make_decoder, False)


def _fixed_tuple_column(args: tuple, where: str) -> Column:
    parts = [_column(a, f"{where}[{i}]") for i, a in enumerate(args)]
    immutable = all(p.immutable for p in parts)

    def columns(values: list) -> list:
        return [list(c) for c in zip(*values)] if values else [[] for _ in parts]

    def capture(values: list) -> Any:
        return values if immutable else [p.capture(c) for p, c in zip(parts, columns(values))]

    def render(captured: Any) -> list:
        cols = [p.capture(c) for p, c in zip(parts, columns(captured))] if immutable else captured
        return [p.render(c) for p, c in zip(parts, cols)]

    def make_decoder(schema: dict) -> Decode:
        decs = [p.decoder(schema) for p in parts]

        def decode(col: Any, n: int) -> list:
            if type(col) is not list or len(col) != len(decs):
                raise _bad(where)
            return list(zip(*[dec(c, n) for dec, c in zip(decs, col)])) if n else []
        return decode
    return Column(capture, render, make_decoder, immutable)


def _dedupe_column() -> Column:
    def capture(values: list) -> list:
        return [[w.size, w.ids()] for w in values]

    def decode(col: Any, n: int) -> list:
        return [_dedupe(v) for v in _expect_list(col, n, "dedupe window")]
    return Column(capture, _ident, lambda schema: decode, False)


def _dedupe(v: Any) -> DedupeWindow:
    if type(v) is not list or len(v) != 2 or type(v[0]) is not int or v[0] < 1 or type(v[1]) is not list:
        raise _bad("dedupe window", v)
    size, ids = v
    if not all(map(isinstance, ids, repeat(str))):
        raise _bad("dedupe ids")
    window = DedupeWindow(size)
    # The window's own fields, filled in bulk: add() per id would cost ~0.3 s at 200k ids.
    window._ids = set(ids)
    if len(window._ids) != len(ids) or len(ids) > size:
        raise SnapshotError("malformed snapshot: dedupe ids repeat or overflow the window")
    window._order = deque(ids)
    return window


_column(ClusterState)   # every column, built now: later calls only read the cache (see the module doc)
