"""Where gpusched's submit-to-start goes, stage by stage, for the jobs of a steady stream
(bench/peer_slurm.py prints it after each gpusched round).

Every stamp is one the system already leaves, no extra instrumentation (all clocks are
this machine's):

* ``sent``: the client's clock just before its ``SubmitJob`` call;
* ``accepted``: the job's ``submitted_at`` (admission's clock when it took the job);
* ``placed``: ``placed_at`` (the placer's ``JobPlaced``);
* ``forked``: the birth time of the worker's folder, which the worker's shim (spawned by
  the agent) makes first: the agent has read the placement and started the shim. File systems stamp it at a coarse clock, a few
  ms early;
* ``spawned``: ``started_at`` in the shim's status file: the shim has spawned the workload;
* ``stamp``: the workload's own record of its start;
* ``running``: the job's ``started_at``, the time of the agent's ``WorkerStarted`` (it has
  seen the shim's status file);
* ``exited``, ``ended``: then the end: ``ended_at`` in the shim's status file, and the
  job's ``ended_at`` (the agent's ``WorkerFinished``; until the log has it, the GPU stays
  held).
"""
from __future__ import annotations

import json
from pathlib import Path

STAGES = (("submit call", "sent", "accepted"), ("log -> placed", "accepted", "placed"),
          ("placed -> agent's shim forked", "placed", "forked"),
          ("shim forked -> workload spawned", "forked", "spawned"),
          ("spawned -> workload's stamp", "spawned", "stamp"), ("spawned -> agent's WorkerStarted", "spawned", "running"),
          ("total: sent -> workload's stamp", "sent", "stamp"),
          ("then: spawned -> shim saw the end", "spawned", "exited"), ("shim saw the end -> WorkerFinished", "exited", "ended"))


def birth_time(path: Path) -> float | None:
    """A file's creation time (statx's btime, through coreutils' stat: Python's os.stat
    has none on Linux); None where the file system keeps none."""
    import subprocess
    out = subprocess.run(["stat", "-c", "%.9W", str(path)], capture_output=True, text=True).stdout.strip()
    try:
        value = float(out)
    except ValueError:
        return None
    return value or None


def job_stamps(job, sent: float, stamp: float | None, agent_dirs: list[Path]) -> dict[str, float] | None:
    """The stamps of one job (a ``gpusched.v1.Job``), None when one is missing."""
    stamps = worker_stamps(job, agent_dirs)
    if stamps is None or stamp is None:
        return None
    stamps.update(sent=sent, stamp=stamp)
    return stamps if sent > 0 and stamp > 0 else None


def worker_stamps(job, agent_dirs: list[Path]) -> dict[str, float] | None:
    """The stamps of a job's worker 0 that the log and its shim left, None when one is missing."""
    from gpusched.client import seconds
    name = f"{job.job_id}-{job.attempt}-0"
    folder = next((d / name for d in agent_dirs if (d / name).is_dir()), None)
    if folder is None:
        return None
    try:
        status = json.loads((folder / "shim.json").read_text())
    except (OSError, ValueError):
        return None
    stamps = {"accepted": seconds(job.submitted_at), "placed": seconds(job.placed_at),
              "forked": birth_time(folder), "spawned": status.get("started_at"),
              "running": seconds(job.started_at), "exited": status.get("ended_at"), "ended": seconds(job.ended_at)}
    return stamps if all(isinstance(v, float) and v > 0 for v in stamps.values()) else None


def breakdown(jobs, sent: dict[str, float], stamps: dict[str, float], work: Path, pct) -> list[str]:
    """Lines: p50 and p99 (ms; ``pct(values, q)``, the quantile) of each stage over the
    jobs of one stream."""
    agent_dirs = sorted(p for p in work.glob("agent-n*") if p.is_dir())
    rows = [s for j in jobs if j.job_id in sent
            if (s := job_stamps(j, sent[j.job_id], stamps.get(j.job_id), agent_dirs)) is not None]
    lines = [f"    stages over {len(rows)} jobs (ms):       p50      p99"]
    for label, start, end in STAGES:
        values = [1000 * (r[end] - r[start]) for r in rows]
        lines.append(f"    {label:34s} {pct(values, .5):8.1f} {pct(values, .99):8.1f}")
    return lines



# A GPU slot's turnaround in a burst: from one job's end on a node's GPU to the next job's
# start on it. Stamps of the job before (``prev``) and the next (``next``) on the slot; the
# record timestamps are Kafka's CreateTime, the producer's clock at its send:
# ``report``: the agent's WorkerFinished on its report topic; ``log_finished``: the relay's
# append of it to the pool log; ``log_placed``: the placer's append of the next JobPlaced;
# ``view``: the next job's first record on the node's work view (the relay's writer).
SLOT_STAGES = (("shim saw the end -> agent's WorkerFinished", "exited", "ended"),
               ("WorkerFinished -> its report sent", "ended", "report"),
               ("report -> relay appended it", "report", "log_finished"),
               ("appended -> placer's next cycle", "log_finished", "placed"),
               ("cycle -> JobPlaced appended", "placed", "log_placed"),
               ("JobPlaced -> work-view record", "log_placed", "view"),
               ("work view -> agent's shim forked", "view", "forked"),
               ("shim forked -> workload spawned", "forked", "spawned"),
               ("total: end seen -> next spawned", "exited", "spawned"),
               ("(the job before: spawned -> end seen)", "prev_spawned", "exited"))


async def record_times(connection, topics, nodes: list[str]) -> dict[tuple[str, str, str], float]:
    """(where, kind, job id) -> the first record's timestamp (s): ``("log", event type,
    job)`` from the pool log, ``("report", event type, job)`` from the nodes' report
    topics, ``("view", "", job)`` from their work views."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from gpusched.adapters.log import codec
    from gpusched.adapters.nodes.reports import report_topic
    from gpusched.adapters.nodes.work_view import JOB_KEY, work_topic
    kinds = {topics.events: "log", **{report_topic(topics.prefix, n): "report" for n in nodes},
             **{work_topic(topics.prefix, n): "view" for n in nodes}}
    consumer = AIOKafkaConsumer(**connection.client_args(), enable_auto_commit=False)
    await consumer.start()
    times: dict[tuple[str, str, str], float] = {}
    try:
        metadata = await consumer._client.fetch_all_metadata()   # as the work-view writer reads it
        tps = [TopicPartition(t, p) for t in kinds for p in metadata.partitions_for_topic(t) or ()]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
            for tp, records in (await consumer.getmany(timeout_ms=500)).items():
                for r in records:
                    if (key := _record_key(kinds[tp.topic], r, codec, JOB_KEY)) is not None:
                        times.setdefault(key, r.timestamp / 1000)
    finally:
        await consumer.stop()
    return times


def _record_key(kind: str, record, codec, job_key: str) -> tuple[str, str, str] | None:
    if kind == "view":
        key = (record.key or b"").decode()
        return ("view", "", key[len(job_key):]) if key.startswith(job_key) and record.value else None
    try:
        event = codec.decode(record.value or b"")[0]
    except codec.DecodeError:
        return None   # a usage record on a report topic
    job_id = getattr(event, "job_id", None)
    return (kind, type(event).__name__, job_id) if job_id else None


def slot_pairs(jobs, agent_dirs: list[Path], times: dict) -> list[dict[str, float]]:
    """The stamps of every pair of jobs that ran one after the other on the same node and
    GPU (one-worker, one-GPU jobs), in SLOT_STAGES' names."""
    slots: dict[tuple[str, int], list[dict[str, float]]] = {}
    for job in jobs:
        if len(job.workers) != 1 or len(job.workers[0].gpus) != 1 or not job.placed_at.seconds:
            continue
        stamps = worker_stamps(job, agent_dirs)
        if stamps is None:
            continue
        stamps.update(report=times.get(("report", "WorkerFinished", job.job_id)),
                      log_finished=times.get(("log", "WorkerFinished", job.job_id)),
                      log_placed=times.get(("log", "JobPlaced", job.job_id)), view=times.get(("view", "", job.job_id)))
        w = job.workers[0]
        slots.setdefault((w.node, w.gpus[0].index), []).append(stamps)
    pairs = []
    for runs in slots.values():
        runs.sort(key=lambda s: s["spawned"])
        for prev, nxt in zip(runs, runs[1:]):
            pair = {k: nxt[k] for k in ("placed", "log_placed", "view", "forked", "spawned")}
            pair.update({k: prev[k] for k in ("exited", "ended", "report", "log_finished")}, prev_spawned=prev["spawned"])
            if all(isinstance(v, float) for v in pair.values()):
                pairs.append(pair)
    return pairs


def slot_breakdown(jobs, work: Path, times: dict, pct) -> list[str]:
    """Lines: p50 and p99 (ms) of each stage of a slot's turnaround over a burst's jobs."""
    agent_dirs = sorted(p for p in work.glob("agent-n*") if p.is_dir())
    pairs = slot_pairs(jobs, agent_dirs, times)
    lines = [f"    slot turnaround over {len(pairs)} pairs (ms):          p50      p99"]
    for label, start, end in SLOT_STAGES:
        values = [1000 * (p[end] - p[start]) for p in pairs]
        lines.append(f"    {label:42s} {pct(values, .5):8.1f} {pct(values, .99):8.1f}")
    return lines
