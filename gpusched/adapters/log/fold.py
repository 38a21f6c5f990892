"""Folding records of the pool log into a partition's ``ClusterState``: the replay hot
path, on records fetched by the follower's consumer and on frames from a catch-up reader.

Each applies the shared reducer in offset order, skips what the state already covers,
tells the service through ``on_event`` and dead-letters what cannot be applied (a record
that does not decode, a reducer error) with the reason. The two loops are written out
side by side rather than sharing a per-event helper: a call per event is ~0.1 us on both
replay paths. tests/integration/test_parallel_catchup.py holds the two to the same
callbacks, states and dead letters.
"""
from __future__ import annotations

import gc
import logging
from typing import Callable

from gpusched.adapters.log import codec, flat

from gpusched.adapters.telemetry import tracing
from gpusched.adapters.log.gc_pacing import gc_paused
from gpusched.adapters.log.publisher import DeadLetters, DeadRecord
from gpusched.core import events as ev
from gpusched.core.reducer import Outcome, apply
from gpusched.core.state import ClusterState

log = logging.getLogger(__name__)

# (partition, offset, event, outcome, state)
OnEvent = Callable[[int, int, ev.Event, Outcome, ClusterState], None]


async def fold_records(name: str, state: ClusterState, records, on_event: OnEvent | None,
                       dead_letters: DeadLetters, live: bool = True) -> bool:
    """Fold consumer records in order into ``state``; whether any was new. One tight loop,
    names bound locally, awaiting only to write a dead letter. ``live``: the records are
    news, not a replay of history (only news get consumer spans)."""
    decode, decode_error, fold = codec.decode, codec.DecodeError, apply
    traced = tracing.consume_hook(live)   # None unless this process exports spans
    last = state.offset
    folded = False
    for record in records:
        offset = record.offset
        if offset <= last:
            continue
        folded = True
        try:
            event, envelope = decode(record.value)
        except decode_error as exc:
            state.offset = last = offset
            await dead_letters.put(record, str(exc))
            continue
        except codec.NewerLogSchema as exc:   # stops the process: never folded, never skipped
            raise exc.at(f"{record.topic}[{record.partition}]@{offset}") from None
        try:
            outcome = fold(state, event)
        except Exception as exc:  # a reducer bug must not stop the service
            log.exception("reducer failed on %s:%s", record.partition, offset)
            state.offset = last = offset
            await dead_letters.put(record, f"reducer error: {exc!r}")
            continue
        state.offset = last = offset
        if traced is not None:
            traced(record, event, envelope, outcome.accepted)
        if on_event is not None:
            try:
                on_event(record.partition, offset, event, outcome, state)
            except Exception:
                log.exception("%s: handler failed on %s:%s", name, record.partition, offset)
    return folded


def fold_flat(name: str, topic: str, partition: int, state: ClusterState, offsets: list[int], items: list[tuple],
              on_event: OnEvent | None, freeze: bool) -> list[tuple[DeadRecord, str]]:
    """``fold_records`` for a catch-up frame: the same fold, on events rebuilt from their
    flat form, with the cyclic GC paused; the records to dead-letter, with their reasons.
    With ``freeze``, what the frame built joins the GC's permanent generation."""
    build, fold = flat.BUILD_BY_CODE, apply
    last, dead = state.offset, []
    with gc_paused():
        for offset, item in zip(offsets, items):
            if offset <= last:
                continue
            code = item[0]
            if code == flat.NEWER_SCHEMA:   # (NEWER_SCHEMA, schema, producer): stops the process
                raise codec.NewerLogSchema(item[1], item[2], f"{topic}[{partition}]@{offset}")
            if code < 0:   # did not decode: (-1, reason, key, value)
                state.offset = last = offset
                dead.append((DeadRecord(topic, partition, offset, item[2], item[3]), item[1]))
                continue
            event = build[code](item)
            try:
                outcome = fold(state, event)
            except Exception as exc:  # a reducer bug must not stop the service
                log.exception("reducer failed on %s:%s", partition, offset)
                state.offset = last = offset
                # the reader kept no bytes of a record that decoded: the letter carries
                # the event encoded again (same fields; the pool is the partition's)
                dead.append((DeadRecord(topic, partition, offset, None, codec.encode(event, "")),
                             f"reducer error: {exc!r}"))
                continue
            state.offset = last = offset
            if on_event is not None:
                try:
                    on_event(partition, offset, event, outcome, state)
                except Exception:
                    log.exception("%s: handler failed on %s:%s", name, partition, offset)
        if freeze:
            gc.freeze()   # what the frame built joins the state for good (see follower)
    return dead
