"""Queue keys and shapes kept between cycles (``gpusched.policies.queueing.keys``): the
cycle orders and decides as without them, offers only the first job of a shape that
failed, and never serves a key made for another job of the same id."""
from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.model import WorkerResources
from gpusched.policies.memory import CycleMemory
from gpusched.policies.queueing.order import priority_key
from gpusched.policies.queueing.keys import QueueKeys
from gpusched.policies.scheduler import Scheduler, SchedulerConfig, _Cycle
from tests.unit.core.builders import Log, make_node, make_spec, whole
from tests.unit.policies.shape_skim import offer_every_shape


def offered_and_decided(log: Log, scheduler: Scheduler, skim: bool, monkeypatch):
    """The jobs offered and the decisions of a cycle; without ``skim`` one that offers
    every job, though its shape failed before."""
    seen: list[str] = []
    real = _Cycle.offer

    def spy(run, job, *shape):
        seen.append(job.job_id)
        return real(run, job, *shape)
    with monkeypatch.context() as patch:
        patch.setattr(_Cycle, "offer", spy)
        if not skim:
            offer_every_shape(patch)
        decided = [(d.job_id, d.workers) for d in scheduler.cycle(log.state, log.now, CycleMemory())]
    return seen, decided


def busy_pool() -> Log:
    """One 2-GPU node with one GPU taken; waiting: 2-GPU jobs (never fit now), then one
    1-GPU job, then more 2-GPU jobs, at mixed priorities."""
    log = Log(make_node("n1", 2))
    log.submit("run", gpus=1)
    log.run("run", ("n1", whole(0)))
    for i in range(5):
        log.submit(f"big{i}", make_spec(gpus=2, priority_class="training-high" if i == 3 else "training"))
    log.submit("small", gpus=1)
    for i in range(5, 8):
        log.submit(f"big{i}", gpus=2)
    return log


def test_a_failed_shape_is_offered_once_and_the_decisions_are_unchanged(monkeypatch):
    log = busy_pool()
    scheduler = Scheduler(SchedulerConfig(queue="priority", backfill=False, reserve_after_s=math.inf))
    all_offered, expected = offered_and_decided(log, scheduler, False, monkeypatch)
    assert all_offered[0] == "big3" and len(all_offered) == 9   # every waiting job, priority first
    skimmed, got = offered_and_decided(log, scheduler, True, monkeypatch)
    assert got == expected == [("small", got[0][1])]
    assert skimmed == ["big3", "small"]   # the first 2-GPU job failed: the others are not offered


@pytest.mark.parametrize("reserve_after, offered", [
    (math.inf, ["big3", "small"]),            # big3 is reserved for; the other 2-GPU jobs cannot be
    (0.0, ["big3", "big0", "small"]),         # big0 may get the second reservation (depth 2): offered
])
def test_with_backfill_a_failed_shape_is_offered_while_it_may_get_a_reservation(monkeypatch, reserve_after,
                                                                              offered):
    """With reservations a job of a failed shape is skipped only when it can neither be
    placed nor be reserved for (``_Cycle.bound_to_fail``); the decisions are those of the
    cycle that offers every job."""
    log = busy_pool()
    scheduler = Scheduler(SchedulerConfig(queue="priority", backfill=True, reserve_after_s=reserve_after))
    every, expected = offered_and_decided(log, scheduler, False, monkeypatch)
    assert len(every) == 9
    reservations = [r.job.job_id for r in scheduler.reservations]
    got_offered, got = offered_and_decided(log, scheduler, True, monkeypatch)
    assert got == expected and [r.job.job_id for r in scheduler.reservations] == reservations
    assert got_offered == offered


def test_a_job_id_back_as_another_job_gets_its_own_key():
    """Retention dropped the job and freed its key: the same id, a new submission."""
    log = Log(make_node("n1", 1), retention_s=10.0)
    log.submit("j", make_spec(priority_class="best-effort"), key="k")
    keys = QueueKeys()
    keys.bind(priority_key, log.state)
    first = keys.key(log.job("j"))
    assert log(ev.JobCancelled, job_id="j", reason="user").accepted
    log.now += 20.0
    log.submit("other", gpus=1)                      # moves the clock: "j" is pruned
    assert "j" not in log.state.jobs
    log.submit("j", make_spec(priority_class="production-inference"), key="k")
    second = keys.key(log.job("j"))
    assert second == priority_key(log.job("j")) != first


def test_entries_of_jobs_that_left_the_queue_are_dropped():
    log = Log(make_node("n1", 1))
    keys = QueueKeys()
    for i in range(200):
        log.submit(f"j{i}", gpus=1)
    keys.bind(priority_key, log.state)
    for i in range(200):
        keys.shape(log.job(f"j{i}"))
    for i in range(199):
        assert log(ev.JobCancelled, job_id=f"j{i}", reason="user").accepted
    keys.bind(priority_key, log.state)
    assert set(keys._entries) == {"j199"}


def test_another_key_function_starts_afresh():
    log = Log(make_node("n1", 1))
    log.submit("j", make_spec(priority_class="training-high"))
    keys = QueueKeys()
    keys.bind(priority_key, log.state)
    assert keys.key(log.job("j")) == priority_key(log.job("j"))
    keys.bind(lambda job: job.seq, log.state)
    assert keys.key(log.job("j")) == log.job("j").seq


GPU_FORMS = ({"gpus": 1}, {"gpus": 2}, {"gpu_milli": 500}, {"gpu_milli": 500, "gpu_memory_mib": 5},
             {"mig_profile": "1g.10gb"})
resources_st = st.builds(lambda form, cpu, mem, models: WorkerResources(cpu_milli=cpu, memory_mib=mem,
                                                                        gpu_models=models, **form),
                         st.sampled_from(GPU_FORMS), st.sampled_from([0, 1000]), st.sampled_from([0, 1000]),
                         st.sampled_from([(), ("H100-80GB",)]))
shape_st = st.tuples(st.sampled_from(["default", "p"]), st.integers(1, 2), resources_st)


@settings(max_examples=100, deadline=None)
@given(shapes=st.lists(shape_st, min_size=1, max_size=12), numbered=st.integers(0, 12))
def test_equal_shapes_get_equal_numbers_and_fair_share_sees_them(shapes, numbered):
    """Two jobs get one shape number exactly when their (pool, workers, resources) are
    equal; ``waiting_shapes`` reports each waiting shape by that number (-1: none yet)."""
    log = Log(make_node("n1", 1), make_node("n2", 1, pool="p"))
    for i, (pool, workers, resources) in enumerate(shapes):
        spec = dataclasses.replace(make_spec(), pool=pool, workers=workers, resources=resources)
        assert log.submit(f"j{i}", spec).accepted
    keys = QueueKeys()
    keys.bind(None, log.state)
    keys.fair_queues().sync(log.state, log.now, math.inf)
    assert sorted(keys.waiting_shapes()) == sorted((-1, pool) for pool, _, _ in set(shapes))
    number = {i: keys.shape(log.job(f"j{i}")) for i in range(min(numbered, len(shapes)))}
    for i, j in itertools.combinations(number, 2):
        assert (number[i] == number[j]) == (shapes[i] == shapes[j])
    by_shape = {shapes[i]: n for i, n in number.items()}
    assert sorted(keys.waiting_shapes()) == sorted((by_shape.get(s, -1), s[0]) for s in set(shapes))
