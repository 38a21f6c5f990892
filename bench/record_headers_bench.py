"""Benchmark: what the records' Kafka headers (docs/reference/consuming-the-log.md) cost a reader and
the log's size. ``replay_bench.py``'s pool workload is encoded as the publisher writes it
(``codec.encode`` + ``publisher.event_headers``) into Kafka record batches (format v2,
no compression, as the services produce), with and without the headers, for tracing off
(schema and type headers) and on (a job's events carry a ``traceparent`` in the envelope,
and then in a header too); each batch is then
parsed by aiokafka's record reader, as a consumer fetching the log does. Per record:
bytes, µs to parse (best of ``--repeat``), and µs to build its headers.

    .venv/bin/python bench/record_headers_bench.py --count 100000
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder  # noqa: E402

from bench.pool_workload import PoolSim  # noqa: E402
from gpusched.adapters.log import codec  # noqa: E402
from gpusched.adapters.log.publisher import event_headers  # noqa: E402

CONTEXT = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
BATCH = 2000   # records a batch: the fetches of a replay bring batches of about this size


def batches(records: list[tuple[bytes, list]]) -> list[bytes]:
    out = []
    for start in range(0, len(records), BATCH):
        builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                            producer_epoch=-1, base_sequence=-1, batch_size=1 << 30)
        for offset, (value, headers) in enumerate(records[start:start + BATCH]):
            builder.append(offset, timestamp=None, key=b"default", value=value, headers=headers)
        out.append(bytes(builder.build()))
    return out


def parse_s(data: list[bytes]) -> float:
    started = time.perf_counter()
    for batch in data:
        for record in DefaultRecordBatch(batch):
            record.headers   # what a consumer reads
    return time.perf_counter() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=100_000)
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    sim = PoolSim(7, args.nodes)
    sim.run(args.count)
    n = len(sim.events)
    started = time.perf_counter()
    for e in sim.events:
        event_headers(e, {})
    build_us = 1e6 * (time.perf_counter() - started) / n
    print(f"{n} records; building the headers of one: {build_us:.2f} µs")
    for tracing, context in (("off", {}), ("on", CONTEXT)):
        before = None
        for label, headers in (("no headers", False), ("headers", True)):
            records = []
            for e in sim.events:
                carrier = context if getattr(e, "job_id", None) else {}
                records.append((codec.encode(e, "default", carrier), event_headers(e, carrier) if headers else []))
            data = batches(records)
            parse = min(parse_s(data) for _ in range(args.repeat))
            size = sum(map(len, data)) / n
            before = before or (size, parse)
            print(f"tracing {tracing:3s} {label:10s} {size:6.1f} bytes/record (x{size / before[0]:.2f})   "
                  f"parse {1e6 * parse / n:.3f} µs/record (+{1e6 * (parse - before[1]) / n:.3f})")

if __name__ == "__main__":
    main()
