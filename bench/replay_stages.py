"""Benchmark: where a replayed event's time goes, stage by stage, on a kept pool log.

Reads the pool's partition of a log kept by ``bench/replay_bench.py --keep`` with aiokafka
(CPU time of the read alone), then, on the records in memory, times each stage by itself
with the cyclic GC off: envelope parse, decode to domain events (parse included), and the
reducer folding the decoded events into a fresh state. Per event, in µs.

    .venv/bin/python bench/replay_stages.py --reuse bench-replay-<hex>.

The log's own finished-job retention (its JobRetentionSet) applies, as in the services.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import os
import pickle
import sys
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiokafka import AIOKafkaConsumer, TopicPartition  # noqa: E402

from gpusched import native  # noqa: E402
from gpusched.adapters.log import codec, flat  # noqa: E402
from gpusched.adapters.log.catchup import FRAME_EVENTS  # noqa: E402
from gpusched.adapters.log.publisher import partition_for  # noqa: E402
from gpusched.adapters.broker.kafka_admin import TopicNames  # noqa: E402
from gpusched.adapters.broker.kafka_security import KafkaConnection, client_args  # noqa: E402
from gpusched.core.reducer import apply  # noqa: E402
from gpusched.core.state import ClusterState  # noqa: E402
from gpusched.v1 import events_pb2  # noqa: E402

POOL, PARTITIONS = "default", 4   # as replay_bench writes it


async def read_values(bootstrap: str, topic: str, partition: int) -> tuple[list[bytes], float]:
    consumer = AIOKafkaConsumer(**client_args(bootstrap), enable_auto_commit=False,
                                max_partition_fetch_bytes=8 << 20, fetch_max_bytes=64 << 20)
    await consumer.start()
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        values: list[bytes] = []
        c0 = time.process_time()
        while len(values) < end:
            for records in (await consumer.getmany(timeout_ms=1000, max_records=20_000)).values():
                values.extend(r.value for r in records)
        return values, time.process_time() - c0
    finally:
        await consumer.stop()


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092"))
    p.add_argument("--reuse", required=True, help="topic prefix of a log kept by replay_bench.py --keep")
    args = p.parse_args()
    values, read_cpu = asyncio.run(read_values(KafkaConnection.from_env(bootstrap=args.bootstrap), TopicNames(args.reuse).events,
                                               partition_for(POOL, PARTITIONS)))
    n = len(values)
    gc.disable()
    parse = timed(lambda: deque(map(events_pb2.EventEnvelope.FromString, values), maxlen=0))   # keeps none
    events: list = []
    decode = timed(lambda: events.extend(codec.decode(v)[0] for v in values))
    state = ClusterState()
    fold = timed(lambda: [apply(state, e) for e in events])
    us = 1e6 / n
    print(f"reducer: {native.status}")
    print(f"{n:,} events of {args.reuse}cluster-events; per event: aiokafka read {read_cpu * us:.2f} µs CPU, "
          f"envelope parse {parse * us:.2f} µs, decode (parse included) {decode * us:.2f} µs, "
          f"reducer {fold * us:.2f} µs (retention {state.retention_s:g} s; {len(state.jobs):,} jobs at the end); "
          f"decode + reducer alone: {n / (decode + fold):,.0f} events/s")
    del events, state
    catch_up_stages(values)


def catch_up_stages(values: list[bytes]) -> None:
    """The two sides of a parallel catch-up on the same records, as the reader frames them
    (``catchup.read_range``) and the follower folds them (``gpusched.adapters.log.fold.fold_flat``)."""
    n = len(values)
    frames: list[bytes] = []

    def write() -> None:
        for i in range(0, n, FRAME_EVENTS):
            frames.append(pickle.dumps((list(range(i, i + FRAME_EVENTS)),
                                        [codec.decode_flat(v) for v in values[i:i + FRAME_EVENTS]]), protocol=5))
            flat.forget_strings()
    reader = timed(write)
    loaded: list = []
    load = timed(lambda: loaded.extend(pickle.loads(f)[1] for f in frames))
    build, events = flat.BUILD_BY_CODE, []
    rebuild = timed(lambda: events.extend(build[item[0]](item) for items in loaded for item in items))
    del loaded
    state = ClusterState()
    fold = timed(lambda: [apply(state, e) for e in events])
    us = 1e6 / n
    side = load + rebuild + fold
    print(f"parallel catch-up, per event: reader side (decode to flat tuples + pickle) {reader * us:.2f} µs; "
          f"folding side: load {load * us:.2f} + rebuild {rebuild * us:.2f} + reducer {fold * us:.2f} = "
          f"{side * us:.2f} µs, alone {n / side:,.0f} events/s (a live replay adds the fetch, the pipe, "
          f"and objects that die away from the cache)")


if __name__ == "__main__":
    main()
