"""Benchmark: the cost of one more hop through the broker, and of SASL_SSL.

A node-agent report relayed through a topic of its own (docs/reference/kafka-security.md) takes one
more produce (acks=all, idempotent) and one more consume than a report written straight to
the pool log. This measures that hop: one record at a time, produce -> a consumer that
already waits for it, in ms, and a burst's throughput; on the connection given by the
environment (``KAFKA_BOOTSTRAP_SERVERS`` and ``GPUSCHED_KAFKA_*``, see
gpusched.adapters.broker.kafka_security), so the same run on a plaintext and a secured broker
gives the cost of SASL_SSL too.

    GPUSCHED_KAFKA_SECURITY_PROTOCOL=SASL_SSL GPUSCHED_KAFKA_USER=admin \\
    GPUSCHED_KAFKA_PASSWORD=... GPUSCHED_KAFKA_CA=.run/kafka/secrets/ca.pem \\
    KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:19092 .venv/bin/python bench/kafka_hop_bench.py
"""
from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # noqa: E402

from gpusched.adapters.broker.kafka_admin import TopicNames, delete_topics, ensure_topics  # noqa: E402
from gpusched.adapters.broker.kafka_security import KafkaConnection, client_args  # noqa: E402


async def run(conn: KafkaConnection, count: int, burst: int) -> dict:
    names = TopicNames(f"bench-hop-{secrets.token_hex(3)}.")
    await ensure_topics(conn, names, 1)
    producer = AIOKafkaProducer(**client_args(conn), acks="all", enable_idempotence=True, linger_ms=0)
    consumer = AIOKafkaConsumer(**client_args(conn), enable_auto_commit=False, fetch_max_wait_ms=500)
    await producer.start()
    await consumer.start()
    tp = TopicPartition(names.events, 0)
    consumer.assign([tp])
    await consumer.seek_to_end(tp)
    try:
        hops = []
        for i in range(count):
            t0 = time.perf_counter()
            await producer.send_and_wait(names.events, b"x" * 200, partition=0)
            while not (await consumer.getmany(tp, timeout_ms=1000)).get(tp):
                pass
            hops.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        futures = [await producer.send(names.events, b"x" * 200, partition=0) for _ in range(burst)]
        await asyncio.gather(*futures)
        got = 0
        while got < burst:
            got += len((await consumer.getmany(tp, timeout_ms=1000)).get(tp, ()))
        rate = burst / (time.perf_counter() - t0)
    finally:
        await consumer.stop()
        await producer.stop()
        await delete_topics(conn, names)
    hops.sort()
    return {"protocol": conn.security_protocol, "hop_p50_ms": round(statistics.median(hops), 2),
            "hop_p99_ms": round(hops[int(0.99 * (len(hops) - 1))], 2), "burst_per_s": round(rate)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=300, help="sequential hops timed")
    parser.add_argument("--burst", type=int, default=5000, help="records in the throughput burst")
    args = parser.parse_args()
    print(asyncio.run(run(KafkaConnection.from_env(), args.count, args.burst)))


if __name__ == "__main__":
    main()
