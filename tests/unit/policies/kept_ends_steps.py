"""Random changes to the state for the tests of what is kept between cycles: ``step`` (a
strategy of one change) and ``apply_step`` (it, through the reducer), on ``NODES``."""
from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, settings, strategies as st

from gpusched.core import events as ev
from gpusched.core.model import JobPhase
from tests.unit.core.builders import Log, make_node, make_spec, whole


NODES = ("n0", "n1", "n2")
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

step = st.one_of(
    st.tuples(st.just("place"), st.integers(0, 2), st.integers(1, 3), st.sampled_from((0.0, 5.0, 30.0, 90.0)),
              st.booleans()),
    st.tuples(st.just("start"), st.integers(0, 30)),
    st.tuples(st.just("cancel"), st.integers(0, 30)),
    st.tuples(st.just("stopped"), st.integers(0, 30)),
    st.tuples(st.just("limit"), st.sampled_from((0.0, 20.0, 60.0))),
    st.tuples(st.just("wait"), st.sampled_from((1.0, 40.0))),
    st.tuples(st.just("finish"), st.integers(0, 30), st.integers(0, 1)),
    st.tuples(st.just("preempt"), st.integers(0, 30)),
    st.tuples(st.just("gpu"), st.integers(0, 2), st.integers(0, 5), st.booleans()),
    st.tuples(st.just("lost"), st.integers(0, 2)),
    st.tuples(st.just("register"), st.integers(0, 3)),
    st.just(("drop",)),
    st.just(("drop-nodes",)),
)


def apply_step(log: Log, s: tuple, made: list[str], *, uncut_default_only: bool = False) -> None:
    """One change to the state: a job placed (a gang on two nodes if asked), started,
    cancelled or preempted (it stops), its workers gone, one worker ended, the pool's default time
    limit, time passing, a GPU failed or back, a node lost or (re-)registered, the
    reducer's journal of changed jobs or of changed nodes overrun.

    ``uncut_default_only``: a job is placed only on GPUs not cut into MIG slices, of nodes
    of the default pool (for grammars that cut GPUs and enrol nodes elsewhere)."""
    kind = s[0]
    if kind == "place":
        _, at, gpus, limit, gang = s
        names = [NODES[at], NODES[(at + 1) % len(NODES)]][:1 + gang]
        spots = []
        for name in names:
            node = log.node(name)
            free = [g.info.index for g in node.gpus
                    if not g.used_milli and g.healthy and not (uncut_default_only and g.mig_mask)]
            if len(free) < gpus or not node.schedulable or (uncut_default_only and node.info.pool != "default"):
                return
            spots.append((name, whole(*free[:gpus])))
        job_id = f"j{len(made)}"
        spec = dataclasses.replace(make_spec(workers=len(spots), gpus=gpus, cpu=0, mem=0), max_runtime_s=limit)
        assert log.submit(job_id, spec).accepted
        assert log.place(job_id, *spots).accepted
        made.append(job_id)
    elif kind in ("start", "cancel", "stopped"):
        if not made:
            return
        job = log.job(made[s[1] % len(made)])
        if kind == "start" and job.phase is JobPhase.PLACED:
            log.start_all(job.job_id)
        elif kind == "cancel" and job.phase in (JobPhase.PLACED, JobPhase.RUNNING):
            assert log(ev.JobCancelled, job_id=job.job_id).accepted
        elif kind == "stopped" and job.phase is JobPhase.STOPPING:
            log.stopped(job.job_id)
    elif kind == "limit":
        assert log(ev.PoolTimeLimitsSet, pool="default", default_s=s[1]).accepted
    elif kind == "wait":
        log.now += s[1]
    elif kind == "finish" and made:   # one worker of a job ends (a gang's other may run on)
        job = log.job(made[s[1] % len(made)])
        if job.phase is JobPhase.RUNNING and s[2] < len(job.workers):
            log.finish(job.job_id, s[2], 0)
    elif kind == "preempt" and made:   # stopped to be requeued: its workers go once it stopped
        job = log.job(made[s[1] % len(made)])
        if job.phase in (JobPhase.PLACED, JobPhase.RUNNING):
            assert log(ev.JobPreempted, job_id=job.job_id, attempt=job.attempt, for_job="other").accepted
    elif kind == "gpu":   # a GPU fails (its jobs stop) or comes back
        log(ev.GpuHealthChanged, node=NODES[s[1]], gpu_index=s[2], healthy=s[3])
    elif kind == "lost":
        log(ev.NodeLost, node=NODES[s[1]])
    elif kind == "register":   # an agent (re-)registers: a lost node comes back, or a new node
        name = (*NODES, "n3")[s[1]]
        log(ev.NodeRegistered, node=make_node(name, gpus=6, cpu=64_000, mem=512_000))
    elif kind == "drop":
        # The journal of changed jobs ran over its bound (``CHANGES_KEPT``): its entries so
        # far are dropped, as ``note_changes`` drops the older half.
        state = log.state
        dropped = len(state.changes)
        del state.changes[:dropped]
        state.changes_base += dropped
    elif kind == "drop-nodes":   # the same, of the journal of changed nodes
        state = log.state
        dropped = len(state.node_changes)
        del state.node_changes[:dropped]
        state.node_changes_base += dropped
    # ("check",): nothing changes
