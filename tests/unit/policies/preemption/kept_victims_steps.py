"""Random changes between the preemptor's rounds for the tests of the victim index kept
between them: ``_change`` (one event or clock step) and ``_finish`` (a job ends)."""
from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.model import JobPhase
from gpusched.policies.memory import CycleMemory
from gpusched.policies.preemption.decisions import preemption_decisions, preemption_events
from gpusched.policies.scheduler import Scheduler
from tests.unit.policies.preemption_clusters import Cluster


def _running(state) -> list:
    return sorted((j for j in state.jobs.values() if j.phase in (JobPhase.RUNNING, JobPhase.PLACED)),
                  key=lambda j: j.seq)


def _finish(c: Cluster, job, now: float, code: int = 0) -> None:
    for w in job.workers:
        c.log(ev.WorkerFinished, job_id=job.job_id, attempt=job.attempt, worker=w.worker, node=w.node,
              exit_code=code, time=now)


def _change(c: Cluster, data, now: float, config, memory: CycleMemory) -> None:
    """One random change of the state: what the log brings between two rounds."""
    d, state = data.draw, c.state
    running = _running(state)
    kind = d(st.sampled_from(["checkpoint", "preempt", "decide", "place", "finish", "gpu", "cordon", "start",
                              "register", "lost"]))
    if kind == "checkpoint" and running:
        job = d(st.sampled_from(running))
        c.log(ev.CheckpointSaved, job_id=job.job_id, attempt=job.attempt, checkpoint="c", time=now)
    elif kind == "preempt" and running:
        job = d(st.sampled_from(running))
        why = d(st.sampled_from(["priority", "reclaim"]))
        c.log(ev.JobPreempted, job_id=job.job_id, attempt=job.attempt, for_job="x",
              reason=f"{why}: preempted for x", time=now)
        if d(st.booleans()):
            _finish(c, job, now)
    elif kind == "decide":
        for decision in preemption_decisions(state, now, memory, config)[:2]:
            for e in preemption_events(state, decision, now):
                c.log.replay(e)
            if d(st.booleans()):
                for vid in decision.victims:
                    _finish(c, state.jobs[vid], now)
    elif kind == "place":
        for dec in Scheduler().cycle(state, now, CycleMemory())[:3]:
            c.log(ev.JobPlaced, job_id=dec.job_id, attempt=dec.attempt, workers=dec.workers, time=now)
    elif kind == "start":
        for job in [j for j in running if j.phase is JobPhase.PLACED][:2]:
            for w in job.workers:
                c.log(ev.WorkerStarted, job_id=job.job_id, attempt=job.attempt, worker=w.worker, node=w.node,
                      time=now)
    elif kind == "finish" and running:
        _finish(c, d(st.sampled_from(running)), now, d(st.sampled_from([0, 1])))
    elif kind == "gpu":
        node = d(st.sampled_from(sorted(state.nodes)))
        gpu = d(st.integers(0, len(state.nodes[node].gpus) - 1))
        c.log(ev.GpuHealthChanged, node=node, gpu_index=gpu, healthy=not state.nodes[node].gpus[gpu].healthy,
              time=now)
    elif kind == "cordon":
        node = state.nodes[d(st.sampled_from(sorted(state.nodes)))]
        c.log(ev.NodeUncordoned if node.cordoned else ev.NodeCordoned, node=node.name, time=now)
    elif kind == "register":   # a new node joins, or a known node's agent restarts (maybe into another pool)
        node = state.nodes[d(st.sampled_from(sorted(state.nodes)))]
        name = d(st.sampled_from([node.name, f"x{len(state.nodes)}"]))
        c.log(ev.NodeRegistered, node=replace(node.info, name=name, pool=d(st.sampled_from([node.info.pool, "other"]))),
              time=now)
    elif kind == "lost":
        c.log(ev.NodeLost, node=d(st.sampled_from(sorted(state.nodes))), time=now)
