"""The node-agent's usage reporter: every ``--usage-interval`` seconds it samples the
node's GPUs (NVML, or the simulated model on a simulated node) and publishes one
``WorkerUsage`` record per running worker to ``<prefix>usage``, keyed by node.

Measurements, not history: a record that cannot be sent is logged and dropped (the next
one covers its own window only), never retried into the pool log's path. Which worker
holds which GPUs comes from the log the agent already folds (``follower.states``).
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from dataclasses import replace

from gpusched.adapters.gpus.gpu_usage import NvmlSampler, RunningWorker, SimulatedSampler, UsageRule, parse_usage_rule
from gpusched.adapters.telemetry.metrics import usage_sampled
from gpusched.adapters.nodes.reports import KIND_HEADER, USAGE_KIND
from gpusched.adapters.nodes.usage_records import GpuSample, WorkerUsage, encode_usage
from gpusched.config import NodeAgentSettings
from gpusched.core.model import NodeInfo
from gpusched.core.state import JobState
from gpusched_node_agent.readiness import kept_port
from gpusched_node_agent.replica_load import read_load
from gpusched_node_agent.leftovers import worker_dir_name

log = logging.getLogger("gpusched.node_agent.usage")
Key = tuple[str, int, int]   # (job id, attempt, worker)


# --- settings (main.py) ---------------------------------------------------------------
def usage_rules(own: NodeAgentSettings) -> tuple[UsageRule, ...]:
    """``--simulated-usage`` as rules; a bad one stops the agent with one line naming the flag."""
    try:
        return tuple(parse_usage_rule(text) for text in own.simulated_usage)
    except ValueError as exc:
        raise SystemExit(f"invalid settings: {NodeAgentSettings.error('simulated_usage', str(exc))}") from None


def usage_tasks(agent, interval_s: float, rules: tuple[UsageRule, ...], stop: asyncio.Event) -> list[asyncio.Task]:
    """The reporter task, or none with ``--usage-interval 0``."""
    if not interval_s:
        return []
    return [asyncio.create_task(report_usage(agent, sampler_for(agent.info, rules), interval_s, stop))]


def sampler_for(info: NodeInfo, rules: tuple[UsageRule, ...] = ()):
    if info.simulated:
        return SimulatedSampler(info.gpus, rules)
    import pynvml

    return NvmlSampler(pynvml, info.gpus)


# --- sampling ---------------------------------------------------------------------------
def running_workers(agent) -> list[RunningWorker]:
    """The workers running here that hold GPUs, as the log assigns them."""
    out = []
    for key in list(agent.running):
        job_id, attempt, worker = key
        job = _job(agent, job_id)
        if job is None or job.attempt != attempt:
            continue
        slot = next((w for w in job.workers if w.worker == worker and w.node == agent.name), None)
        if slot is None or not slot.gpus:
            continue   # CPU-only: nothing to sample
        run = agent.runs.get(key)
        out.append(RunningWorker(job_id, attempt, worker, job.spec.name, job.spec.kind.value, slot.gpus,
                                 getattr(run, "usage_file", None)))
    return out


def _job(agent, job_id: str) -> JobState | None:
    for state in agent.follower.states.values():
        job = state.jobs.get(job_id)
        if job is not None:
            return job
    return None


def usage_records(info: NodeInfo, workers: list[RunningWorker], readings: dict[Key, tuple[GpuSample, ...]],
                  last: dict[Key, float], now: float, interval_s: float, simulated: bool) -> list[WorkerUsage]:
    """One record per worker with a reading. A worker's window runs from its previous
    sample (``last``, updated here); its first stands for one interval (a consumer clips
    it to the allocation)."""
    records = []
    for w in workers:
        gpus = readings.get(w.key)
        if not gpus:
            continue
        window = now - last[w.key] if w.key in last and now > last[w.key] else interval_s
        last[w.key] = now
        records.append(WorkerUsage(uuid.uuid4().hex, info.name, info.pool, w.job_id, w.attempt, w.worker,
                                   now, window, gpus, simulated))
    for key in set(last) - {w.key for w in workers}:
        del last[key]   # ended: a later attempt is another key
    return records


async def with_replica_load(agent, records: list[WorkerUsage]) -> list[WorkerUsage]:
    """Worker 0 of a service's replica: its record with the load it reports (``replica_load``)."""
    async def add(record: WorkerUsage) -> WorkerUsage:
        job = _job(agent, record.job_id)
        if record.worker != 0 or job is None or not job.spec.serve_port or not agent.real_processes:
            return record
        port = kept_port(agent.state_dir / worker_dir_name(record.job_id, record.attempt, 0))
        if not port:
            return record
        in_flight, answered = await read_load(port)
        return replace(record, requests_in_flight=in_flight, requests_total=answered)
    return list(await asyncio.gather(*(add(r) for r in records)))


async def publish_usage(agent, sampler, last: dict[Key, float], interval_s: float) -> list[WorkerUsage]:
    workers = running_workers(agent)
    now = time.time()
    readings = await asyncio.to_thread(sampler.read, workers)   # NVML calls block
    records = usage_records(agent.info, workers, readings, last, now, interval_s, sampler.simulated)
    records = await with_replica_load(agent, records)
    usage_sampled(agent.info.pool, agent.name, sum(g.milli * g.sm_percent / 100 for r in records for g in r.gpus
                                                   if g.measured) / 1000)
    # On the node's own report topic: the relay forwards them to <prefix>usage once it
    # checked they are about this node (docs/reference/kafka-security.md).
    topic, key, headers = agent.report_topic, agent.name.encode(), [(KIND_HEADER, USAGE_KIND)]
    sent = await asyncio.gather(*(agent.publisher.send_raw(topic, encode_usage(r), key=key, headers=headers)
                                  for r in records), return_exceptions=True)
    failed = [s for s in sent if isinstance(s, Exception)]
    if failed:
        log.warning("%d of %d usage records not sent: %r", len(failed), len(records), failed[0])
    return records


async def report_usage(agent, sampler, interval_s: float, stop: asyncio.Event) -> None:
    """Sample and publish at the end of every interval until ``stop`` is set."""
    if not (math.isfinite(interval_s) and interval_s > 0):
        raise ValueError(f"interval_s: {interval_s!r} is not a positive number of seconds")
    try:
        await asyncio.to_thread(sampler.start)
    except Exception:   # e.g. NVML gone since the inventory: the agent runs on, unmeasured
        log.exception("GPU usage sampling unavailable; no usage records from this node")
        return
    last: dict[Key, float] = {}
    try:
        while True:
            try:
                await asyncio.wait_for(stop.wait(), interval_s)
                return
            except asyncio.TimeoutError:
                pass
            try:
                await publish_usage(agent, sampler, last, interval_s)
            except asyncio.CancelledError:
                raise
            except Exception:   # a failed sample must not end the reporting
                log.exception("usage sample failed")
    finally:
        sampler.close()
