"""FGD's typical-task count kept between cycles (``placement.fgd.task_mix.KeptMix``) against
one counted afresh from the state, after random changes (jobs submitted to this pool or
another, placed, started, ended, cancelled while waiting, preempted and requeued, MIG
slices, nodes lost and registered, cordons, GPU health, the journal overrun), and whole
FGD cycles that keep it against cycles that keep nothing."""
from __future__ import annotations

from hypothesis import given, strategies as st

from gpusched.core import events as ev
from gpusched.core.state import ClusterState
from gpusched.policies.memory import CycleMemory
from gpusched.policies.placement.arrays import NodeArrays
from gpusched.policies.placement.fgd.fragmentation import PATIENCE, compile_mix, typical_of
from gpusched.policies.placement.fgd.node_scores import KeptScorer, RowScorer, WasteTable, row_takes
from gpusched.policies.placement.fgd.task_mix import KeptMix, raw_counts
from gpusched.policies.scheduler import Scheduler, SchedulerConfig
from tests.unit.core.builders import Log, make_node, make_spec
from tests.unit.policies.kept_index_steps import (
    SETTINGS, change, decided, step as index_step, submit_waiting,
)
from tests.unit.policies.kept_ends_steps import NODES

# (pool, workers, whole GPUs, share milli, MIG profile, CPU milli) of a job that waits.
request = st.tuples(st.sampled_from(("default", "default", "other")), st.integers(1, 2), st.integers(0, 2),
                    st.sampled_from((0, 300, 700)), st.sampled_from(("", "", "1g")), st.sampled_from((0, 8_000)))
step = st.one_of(index_step, st.tuples(st.just("submit"), request), st.tuples(st.just("withdraw"), st.integers(0, 30)))


def cluster() -> Log:
    return Log(*(make_node(n, gpus=6, cpu=64_000, mem=512_000) for n in NODES), make_node("o0", gpus=4, pool="other"))


def act(log: Log, s: tuple, made: list[str], waiting: list[str]) -> None:
    """``test_kept_index.change``, a job submitted to wait, or a waiting job cancelled."""
    if s[0] == "submit":
        pool, workers, gpus, milli, profile, cpu = s[1]
        job_id = f"s{len(waiting)}"
        spec = make_spec(workers=workers, gpus=gpus if not (milli or profile) else 0, milli=0 if profile else milli,
                         mig=profile, cpu=cpu, mem=0, pool=pool)
        assert log.submit(job_id, spec).accepted
        waiting.append(job_id)
    elif s[0] == "withdraw":
        if waiting and waiting[s[1] % len(waiting)] in log.state.pending:
            assert log(ev.JobCancelled, job_id=waiting[s[1] % len(waiting)]).accepted
    else:
        change(log, s, made)


def assert_counts_as_fresh(kept: dict[str, KeptMix], state: ClusterState) -> None:
    for pool, mix in kept.items():
        assert +mix.counts(state) == +raw_counts(state, pool), pool   # (+: zero counts aside)
        assert 0 not in mix.raw.values(), "a request no job asks for any more stays in the count (unbounded)"


@SETTINGS
@given(steps=st.lists(step, max_size=40), looks=st.integers(1, 6))
def test_the_kept_count_is_the_fresh_count_after_any_changes(steps, looks):
    """Read between changes (every few steps), the kept count of each pool is the count
    of its pending and node-holding jobs made afresh."""
    log, made, waiting = cluster(), [], []
    kept = {"default": KeptMix("default"), "other": KeptMix("other")}
    for k, s in enumerate(steps):
        if k % looks == 0:
            assert_counts_as_fresh(kept, log.state)
        act(log, s, made, waiting)
    assert_counts_as_fresh(kept, log.state)


@SETTINGS
@given(steps=st.lists(step, max_size=30), waiting=st.lists(st.tuples(st.integers(1, 2), st.integers(0, 3),
       st.sampled_from((0, 0, 300, 700)), st.sampled_from(("", "")), st.sampled_from((0, 8_000, 30_000))),
       min_size=1, max_size=10), rounds=st.integers(2, 5), apply=st.integers(0, 2),
       placement=st.sampled_from(("fgd", "fgd-lookahead")))
def test_fgd_cycles_that_keep_the_count_decide_as_cycles_that_keep_nothing(steps, waiting, rounds, apply, placement):
    """Over several cycles with changes between them (some decisions placed for good),
    each cycle with the kept count decides as one that counts afresh, and at each
    cycle's start the kept count is the fresh one."""
    log, made, queued = cluster(), [], []
    for s in steps[:len(steps) // 2]:
        act(log, s, made, queued)
    submit_waiting(log, waiting)
    config = SchedulerConfig(placement=placement)
    keeping, fresh, memory = Scheduler(config), Scheduler(config), CycleMemory()
    later = steps[len(steps) // 2:]
    for r in range(rounds):
        kept = memory.indexes
        mixes = {k[1]: v for k, v in (kept.indexes.items() if kept else ()) if isinstance(v, KeptMix)}
        assert_counts_as_fresh(mixes, log.state)
        now = log.now
        mix = typical_of(raw_counts(log.state, "default"))
        result = keeping.schedule(log.state, now, memory)
        assert decided(result) == decided(fresh.schedule(log.state, now, CycleMemory()))
        # A job of the pool placed (not MIG) was placed by FGD, which then used the scorer;
        # a job unplaced may have been turned away without it (its shape bound to fail).
        placed = [log.state.jobs[d.job_id] for d in result.decisions]
        scored = any(j.spec.pool == "default" and not j.spec.resources.is_mig for j in placed)
        assert_scorer_as_fresh(memory, log.state, mix if scored else None, placement == "fgd-lookahead")
        for d in result.decisions[:apply]:
            assert log(ev.JobPlaced, job_id=d.job_id, attempt=d.attempt, workers=d.workers).accepted
        for s in later[r::rounds]:
            act(log, s, made, queued)


def assert_scorer_as_fresh(memory: CycleMemory, state: ClusterState, mix: dict | None, lookahead: bool) -> None:
    """The scorer kept is for the mix at the start of the cycle (``mix``; None when the
    cycle placed no job of the pool, and so may not have looked at the scorer), and scores
    every node of the pool, for every request waiting, as a scorer made afresh for its
    mix does (its memos, from earlier cycles, included). Not looked at, it may be for the
    pool's models before a node of another model registered."""
    kept = memory.indexes
    scorers = [v for k, v in (kept.indexes.items() if kept else ()) if isinstance(v, KeptScorer) and k[-1] == "default"]
    if not scorers or scorers[0].scorer is None:
        return
    held, arrays = scorers[0], NodeArrays(state.nodes, "default")
    if mix is None and held.models != arrays.models:
        return   # a node of another model registered since its last use: ``scorer_for`` renews it at its next
    if mix is not None:
        assert held.shapes == list(mix.items())
    mix = dict(held.shapes)
    assert held.models == arrays.models
    new = RowScorer(compile_mix(mix, arrays.models), WasteTable(mix, PATIENCE), lookahead)
    requests = {state.jobs[j].spec.resources for j in state.pending if state.jobs[j].spec.pool == "default"}
    for res in [r for r in requests if not r.is_mig]:
        takes = row_takes(res, arrays.allowed_models(res))
        for i, (gpu, cpu, mem, idle, gmem) in enumerate(arrays.plain):
            model = int(arrays.model[i])
            row, fresh_row = (s.row(gpu, cpu, mem, model, idle, gmem) for s in (held.scorer, new))
            if takes(row):
                assert held.scorer.scorer(res)(row) == new.scorer(res)(fresh_row), (res, i)


def test_a_cycle_keeps_the_count_and_the_next_reads_the_journal():
    """The first FGD cycle with kept indexes keeps its pool's count; a job submitted
    after it is counted by the next cycle without counting every job again."""
    log = cluster()
    assert log.submit("a", make_spec(milli=300, cpu=0, mem=0)).accepted
    memory, scheduler = CycleMemory(), Scheduler(SchedulerConfig(placement="fgd"))
    scheduler.schedule(log.state, log.now, memory)
    mix = memory.indexes.indexes[("fgd-mix", "default")]
    assert isinstance(mix, KeptMix)
    counted = mix.counted
    assert log.submit("b", make_spec(gpus=2, cpu=0, mem=0)).accepted
    scheduler.schedule(log.state, log.now, memory)
    # brought in step, not rebuilt; "a", pending at the first count, counted from the
    # reducer's count of pending jobs, not listed
    assert mix.counted is counted and set(counted) == {"b"} and mix.unlisted == {"a"}
    assert typical_of(mix.raw) == typical_of(raw_counts(log.state, "default"))


def test_the_first_count_reads_the_pending_jobs_from_the_reducers_count():
    """Counting everything lists the jobs on the pool's nodes only; a pending job the
    journal names later is counted out from its own request, and one pruned since (its
    request unknown) has everything counted again."""
    log = cluster()
    for i, request in enumerate(({"gpus": 1}, {"milli": 300}, {"gpus": 2, "workers": 2})):
        assert log.submit(f"j{i}", make_spec(cpu=0, mem=0, **request)).accepted
    mix = KeptMix("default")
    assert +mix.counts(log.state) == +raw_counts(log.state, "default") and mix.counted == {}
    assert log(ev.JobCancelled, job_id="j0").accepted
    assert +mix.counts(log.state) == +raw_counts(log.state, "default") and mix.unlisted == {"j1", "j2"}
    assert log(ev.JobCancelled, job_id="j1").accepted
    del log.state.jobs["j1"]   # as retention prunes a finished job
    assert +mix.counts(log.state) == +raw_counts(log.state, "default") and mix.unlisted == {"j2"}


def test_a_count_kept_for_one_state_is_not_read_for_another():
    one, other = cluster(), cluster()
    assert one.submit("a", make_spec(milli=300, cpu=0, mem=0)).accepted
    assert other.submit("b", make_spec(gpus=2, cpu=0, mem=0)).accepted
    mix = KeptMix("default")
    assert +mix.counts(one.state) == raw_counts(one.state, "default")
    assert +mix.counts(other.state) == raw_counts(other.state, "default")


def kept_scorer_of(memory: CycleMemory, placement: str = "fgd"):
    kept = memory.indexes.indexes
    return next(v for k, v in kept.items() if k[:2] == ("fgd-scorer", placement)).scorer


def test_the_row_scorer_is_kept_while_the_mix_stays_and_replaced_when_it_changes():
    """Placements leave the mix as it was (a placed job counts as it did waiting): the
    next cycle scores with the same scorer, its memos warm. A submission of another
    request changes the mix: the next cycle scores with a new one."""
    log = cluster()
    for k in range(3):
        assert log.submit(f"a{k}", make_spec(milli=300, cpu=0, mem=0)).accepted
    assert log.submit("g", make_spec(gpus=2, cpu=0, mem=0)).accepted
    memory, scheduler = CycleMemory(), Scheduler(SchedulerConfig(placement="fgd"))
    first = scheduler.schedule(log.state, log.now, memory)
    scorer = kept_scorer_of(memory)
    for d in first.decisions[:2]:
        assert log(ev.JobPlaced, job_id=d.job_id, attempt=d.attempt, workers=d.workers).accepted
    scheduler.schedule(log.state, log.now, memory)
    assert kept_scorer_of(memory) is scorer
    assert log.submit("b", make_spec(milli=700, cpu=0, mem=0)).accepted
    scheduler.schedule(log.state, log.now, memory)
    assert kept_scorer_of(memory) is not scorer


def test_a_scorer_memoizing_too_many_rows_starts_over(monkeypatch):
    from gpusched.policies.placement.fgd import node_scores
    log = cluster()
    assert log.submit("a", make_spec(milli=300, cpu=0, mem=0)).accepted
    memory, scheduler = CycleMemory(), Scheduler(SchedulerConfig(placement="fgd-lookahead"))
    scheduler.schedule(log.state, log.now, memory)
    scorer = kept_scorer_of(memory, "fgd-lookahead")
    assert scorer.kinds() > 0
    monkeypatch.setattr(node_scores, "MAX_KINDS", scorer.kinds() - 1)
    scheduler.schedule(log.state, log.now, memory)
    assert kept_scorer_of(memory, "fgd-lookahead") is not scorer
