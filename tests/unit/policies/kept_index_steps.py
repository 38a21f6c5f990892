"""Random changes for the tests of the placement indexes kept between cycles: ``step`` and
``change`` (``kept_ends_steps``' changes, and MIG slices, cordons, requeues, enrolments),
fresh indexes to compare the kept ones with (``fresh_like``, ``contents``), and waiting
jobs (``submit_waiting``) and a cycle's decisions (``decided``)."""
from __future__ import annotations

from hypothesis import HealthCheck, settings, strategies as st

from gpusched.core import events as ev
from gpusched.core.model import JobPhase
from gpusched.policies.placement.index import FreeIndex
from gpusched.policies.placement.mig_index import MigIndex
from gpusched.policies.placement.topology import GangCapacities
from tests.unit.core.builders import Log, make_node, make_spec, mig
from tests.unit.policies.kept_ends_steps import NODES, apply_step, step as ends_step


SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

step = st.one_of(
    ends_step,
    st.tuples(st.just("mig"), st.integers(0, 2), st.integers(0, 5), st.sampled_from(("1g", "3g")), st.integers(0, 4)),
    st.tuples(st.just("cordon"), st.integers(0, 2), st.booleans()),
    st.tuples(st.just("requeue"), st.integers(0, 30)),
    st.tuples(st.just("enroll"), st.integers(0, 4), st.sampled_from(("default", "other")),
              st.sampled_from(("H100-80GB", "L40S-48GB"))),
)


def change(log: Log, s: tuple, made: list[str]) -> None:
    """``kept_ends_steps.apply_step``, and a MIG slice placed, a node cordoned or uncordoned,
    a node registered (new, or known: its agent restarted) in a pool, with a GPU model."""
    if s[0] == "mig":
        _, at, gpu, profile, start = s
        job_id = f"m{len(log.state.jobs)}"
        assert log.submit(job_id, make_spec(mig=profile, cpu=0, mem=0)).accepted
        log.place(job_id, (NODES[at], mig(gpu, profile, start)))   # may not fit: then it waits
        made.append(job_id)
    elif s[0] == "place":   # as ``apply_step`` does, on GPUs not cut into MIG slices, of the default pool
        apply_step(log, s, made, uncut_default_only=True)
    elif s[0] == "requeue":   # preempted and stopped: its workers are forgotten, it waits again
        job = log.job(made[s[1] % len(made)]) if made else None
        if job is not None and job.phase in (JobPhase.PLACED, JobPhase.RUNNING):
            assert log(ev.JobPreempted, job_id=job.job_id, attempt=job.attempt, for_job="other").accepted
            log.stopped(job.job_id)
    elif s[0] == "enroll":   # refused where the node runs jobs and would change pool
        _, at, pool, model = s
        log(ev.NodeRegistered, node=make_node((*NODES, "n3", "n4")[at], gpus=6, model=model, pool=pool,
                                              cpu=64_000, mem=512_000))
    elif s[0] == "cordon":
        log(ev.NodeCordoned if s[2] else ev.NodeUncordoned, node=NODES[s[1]])
    else:
        apply_step(log, s, made)


def fresh_like(index, state):
    if isinstance(index, GangCapacities):   # the same capacities of every shape it keeps
        fresh = GangCapacities(state.nodes, index.pool, index.levels)
        fresh.shapes = {res: (fresh.capacities(res), 0) for res in index.shapes}
        return fresh
    if isinstance(index, FreeIndex):
        return FreeIndex(state.nodes, index.pool, index.gpu_weight)
    return MigIndex(state.nodes, index.pool, index.profile, index.gpu_weight)


def contents(index) -> tuple:
    if isinstance(index, GangCapacities):
        return index.seq, index.path, {res: index.capacities(res) for res in list(index.shapes)}
    buckets = [index.whole, index.share] if isinstance(index, FreeIndex) else [index.buckets]
    return index.seq, index.where, [{k: b for k, b in kind.items() if b} for kind in buckets]


def decided(result) -> list:
    return sorted((d.job_id, d.workers) for d in result.decisions)


def submit_waiting(log: Log, waiting: list[tuple]) -> None:
    for k, (workers, gpus, milli, profile, cpu) in enumerate(waiting):
        if profile:
            spec = make_spec("abc"[k % 3], workers=workers, mig=profile, cpu=cpu, mem=0, name=f"w{k}")
        else:
            spec = make_spec("abc"[k % 3], workers=workers, gpus=gpus if not milli else 0, milli=milli,
                             cpu=cpu, mem=0, name=f"w{k}")
        assert log.submit(f"w{k}", spec).accepted
