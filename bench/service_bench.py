"""Benchmark: a service scaled from 0 to ``--replicas`` replicas, through the real broker.

Every service (admission with its relay, one placer, the preemptor) and the broker run
here, with ``--nodes`` simulated 8-GPU nodes run by one node host (``gpusched
node-host``). A service of one-GPU replicas (``--milli``: a share instead) is applied at
zero replicas, then scaled to ``--replicas`` in one ``ScaleService`` call. A simulated
replica is ready once it runs (its node host reports it, as an agent reports a replica
without a readiness check), so the figures are the scheduler's and the log's, not a
model server's start.

Reported, from the pool log itself (every time is the log's, from the ``ServiceScaled``
record: the decision):
- replicas placed a second: replicas over the time from the decision to the last
  replica's ``JobPlaced``;
- scale-up time, decision to ready: p50, p99 and max over the replicas'
  ``ReplicaReadiness`` records;
- scale-down time: ``ScaleService`` back to 0, then the time until every replica ended.

    .venv/bin/python bench/service_bench.py --replicas 1000 --nodes 125
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from gpusched.adapters.broker.kafka_admin import TopicNames   # noqa: E402
from gpusched.core import events as ev   # noqa: E402
from gpusched.local_cluster import LocalCluster   # noqa: E402
from gpusched.v1 import admission_pb2, admission_pb2_grpc, types_pb2   # noqa: E402
from scale_bench import quantile, read_events   # noqa: E402
from scale_processes import Broker   # noqa: E402


def service_spec(name: str, milli: int) -> types_pb2.ServiceSpec:
    spec = types_pb2.ServiceSpec(name=name, team="serving", replicas=0, min_replicas=0)
    if milli:
        spec.template.resources.gpu_milli = milli
    else:
        spec.template.resources.gpus = 1
    spec.template.resources.cpu_milli = 1000
    spec.template.resources.memory_mib = 1024
    spec.template.simulated_duration.seconds = 24 * 3600
    return spec


def figures(events: list[ev.Event], service: str, count: int) -> dict[str, float]:
    """The decision's time and, from it, each replica's placement and readiness."""
    up = next(e for e in events if isinstance(e, ev.ServiceScaled) and e.service == service and e.replicas == count)
    down = next((e for e in events if isinstance(e, ev.ServiceScaled) and e.service == service
                 and e.replicas == 0 and e.time > up.time), None)
    replicas = {e.job_id for e in events if isinstance(e, ev.JobPlaced) and e.job_id.startswith(f"{service}-")}
    placed = {e.job_id: e.time for e in events if isinstance(e, ev.JobPlaced) and e.job_id in replicas}
    ready = {}
    for e in events:
        if isinstance(e, ev.ReplicaReadiness) and e.ready and e.job_id not in ready:
            ready[e.job_id] = e.time
    out = {"replicas placed": len(placed), "replicas ready": len(ready),
           "placed/s": len(placed) / max(1e-9, max(placed.values()) - up.time)}
    waits = sorted(t - up.time for t in ready.values())
    out |= {"ready p50 s": quantile(waits, 0.5), "ready p99 s": quantile(waits, 0.99), "ready max s": waits[-1]}
    if down is not None:
        ends = [e.time for e in events if isinstance(e, ev.WorkerFinished) and e.job_id in replicas
                and e.time >= down.time]
        if ends:
            out["all stopped s"] = max(ends) - down.time
    return out


async def main(args: argparse.Namespace) -> None:
    broker = Broker()
    bootstrap = await asyncio.to_thread(broker.start)
    topics = TopicNames(f"svcbench-{int(time.time())}.")
    cluster = LocalCluster(bootstrap, topics, Path(tempfile.mkdtemp(prefix="gpusched-svcbench-")))
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await cluster.preemptor()
        await cluster.node_host("host0", args.nodes, "8xH100-80GB", timeout=1800)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{admission.port}") as channel:
            api = admission_pb2_grpc.ServiceApiStub(channel)
            await api.ApplyService(admission_pb2.ApplyServiceRequest(spec=service_spec("bench", args.milli)))
            t0 = time.perf_counter()
            await api.ScaleService(admission_pb2.ScaleServiceRequest(name="bench", replicas=args.replicas))
            while (await api.GetService(admission_pb2.GetServiceRequest(name="bench"))).ready < args.replicas:
                if time.perf_counter() - t0 > args.timeout:
                    raise SystemExit(f"not every replica ready within {args.timeout}s")
                await asyncio.sleep(0.2)
            print(f"{args.replicas} replicas ready {time.perf_counter() - t0:.1f}s after the call (wall)")
            await api.ScaleService(admission_pb2.ScaleServiceRequest(name="bench", replicas=0))
            while (await api.GetService(admission_pb2.GetServiceRequest(name="bench"))).replicas:
                await asyncio.sleep(0.2)
            await asyncio.sleep(2.0)   # the last workers' ends reach the log
        events = await read_events(bootstrap, topics)
        for name, value in figures(events, "bench", args.replicas).items():
            print(f"{name:>16}: {value:.3f}" if isinstance(value, float) else f"{name:>16}: {value}")
    finally:
        await cluster.stop_all()
        await asyncio.to_thread(broker.stop)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=125)
    parser.add_argument("--milli", type=int, default=0, help="a share of a GPU per replica instead of a whole one")
    parser.add_argument("--timeout", type=float, default=600.0)
    asyncio.run(main(parser.parse_args()))
