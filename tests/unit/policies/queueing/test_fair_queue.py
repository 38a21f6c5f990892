"""Fair share's order kept in per-team queues between cycles (``policies.queueing.fair_queue``)
is the order built whole (``fair_share_oracle``, the algorithm it replaced), on random
logs: jobs submitted, placed, failed back to the queue with a back-off, cancelled; time
moving on (and back); quotas with orgs, decayed usage, aging and nominees; and a cycle
that takes only a prefix of the order before the next one syncs the queues."""
from __future__ import annotations

import dataclasses
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.model import JobPhase, TopologyRequest, WorkerResources
from gpusched.core.priority import PRIORITY_CLASSES
from gpusched.core.state import ClusterState
from gpusched.policies.queueing.fair_queue import TeamQueues
from gpusched.policies.queueing.fairshare import QueueContext, fair_share
from gpusched.policies.queueing.shape_key import shape_key
from gpusched.policies.queueing.keys import QueueKeys
from gpusched.policies.queueing.quota import OrgQuota, QueueTree, TeamQuota
from gpusched.policies.queueing.usage import Demand
from tests.unit.core.builders import Log, make_node, make_spec, whole
from tests.unit.policies.queueing.fair_share_oracle import fair_share_whole

TEAMS = ("a", "b", "c", "d")
TREES = (
    QueueTree(),
    QueueTree(orgs={"x": OrgQuota(teams={"a": TeamQuota(4, 12, 2.0), "b": TeamQuota(2, None, 1.0)}, limit_gpus=20),
                    "y": OrgQuota(teams={"c": TeamQuota(0, 8, 0.5)})}),
    QueueTree(orgs={"x": OrgQuota(teams={"a": TeamQuota(8), "b": TeamQuota(8), "c": TeamQuota(1)})},
              default_team=TeamQuota(2, 6)),
)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ops = st.one_of(
    st.tuples(st.just("submit"), st.sampled_from(TEAMS), st.sampled_from(sorted(PRIORITY_CLASSES)),
              st.integers(1, 4), st.integers(1, 6)),
    st.tuples(st.just("place"), st.integers(0, 10_000)),
    st.tuples(st.just("fail"), st.integers(0, 10_000)),
    st.tuples(st.just("cancel"), st.integers(0, 10_000)),
    st.tuples(st.just("advance"), st.sampled_from([1.0, 7.0, 25.0, 40.0, 300.0, -50.0])),
    st.tuples(st.just("cycle"), st.integers(0, 12), st.booleans()),
    st.tuples(st.just("cycle"), st.integers(0, 12), st.booleans()),
)


def oracle(state: ClusterState, now: float, context: QueueContext) -> list[str]:
    ready = [state.jobs[j] for j in state.pending if state.jobs[j].not_before <= now]
    return [j.job_id for j in fair_share_whole(state, ready, now, context)]


class World:
    def __init__(self) -> None:
        self.log = Log(*(make_node(f"n{i}", gpus=8, cpu=64_000, mem=512_000) for i in range(3)))
        self.state = self.log.state
        self.n = 0
        self.offset = 0.0   # the cycle's clock is the log's plus this

    def submit(self, team: str, priority: str, gpus: int, count: int) -> None:
        for _ in range(count):
            self.n += 1
            spec = make_spec(team, gpus=gpus, cpu=1000 * gpus, mem=0, name=f"j{self.n}", priority_class=priority)
            assert self.log.submit(f"j{self.n}", spec).accepted

    def pick(self, phase: JobPhase, i: int) -> str | None:
        jobs = sorted(j for j, job in self.state.jobs.items() if job.phase is phase)
        return jobs[i % len(jobs)] if jobs else None

    def place(self, i: int) -> None:
        job_id = self.pick(JobPhase.PENDING, i)
        if job_id is None:
            return
        gpus = self.state.jobs[job_id].spec.resources.gpus
        node = next((n for n in self.state.nodes.values() if n.free_whole_gpus() >= gpus), None)
        if node is not None:
            free = [g.info.index for g in node.gpus if g.fits_whole()][:gpus]
            self.log.run(job_id, (node.name, whole(*free)))

    def fail(self, i: int) -> None:
        """A running job's attempt fails: back in the queue, not before its back-off."""
        job_id = self.pick(JobPhase.RUNNING, i)
        if job_id is not None:
            assert self.log(ev.AttemptFailed, job_id=job_id, attempt=self.state.jobs[job_id].attempt).accepted
            self.log.stopped(job_id)

    def cancel(self, i: int) -> None:
        job_id = self.pick(JobPhase.PENDING, i)
        if job_id is not None:
            assert self.log(ev.JobCancelled, job_id=job_id, reason="test").accepted


@SETTINGS
@given(steps=st.lists(ops, min_size=1, max_size=60), tree=st.sampled_from(TREES),
       aging_s=st.sampled_from([0.0, 20.0, 60.0, 1e9]),
       decayed=st.dictionaries(st.sampled_from(TEAMS), st.integers(0, 16_000), max_size=3),
       nominate=st.integers(0, 3))
def test_the_kept_order_is_the_order_built_whole(steps, tree, aging_s, decayed, nominate):
    world = World()
    queues = TeamQueues()
    ledger = {t: Demand(float(g), float(g), 0.0) for t, g in decayed.items()}
    for op, *args in steps:
        if op == "submit":
            world.submit(*args)
        elif op == "advance":
            world.offset += args[0]
        elif op == "cycle":
            take, with_nominees = args
            now = world.log.now + world.offset
            pending = list(world.state.pending)
            nominees = frozenset(pending[:nominate]) if with_nominees else frozenset()
            context = QueueContext(tree, ledger, aging_s, nominees)
            expected = oracle(world.state, now, context)
            queues.sync(world.state, now, aging_s if aging_s > 0 else math.inf)
            # The census of shapes: each waiting job's shape, once.
            specs = [world.state.jobs[j].spec for j in world.state.pending]
            waiting = {shape_key(spec) for spec in specs}
            shapes = list(queues.shapes())
            assert len(shapes) == len(waiting) and set(shapes) == waiting
            order = queues.order(world.state, now, context)
            got = [next(order).job_id for _ in range(min(take, len(expected)))]
            assert got == expected[:take]
            if take % 3 == 0:   # now and then the whole order
                assert got + [j.job_id for j in order] == expected
        else:
            getattr(world, op)(args[0])


@SETTINGS
@given(steps=st.lists(st.tuples(st.sampled_from(TEAMS), st.sampled_from(sorted(PRIORITY_CLASSES)),
                                st.integers(1, 4)), min_size=1, max_size=30),
       tree=st.sampled_from(TREES), aging_s=st.sampled_from([0.0, 3.0, 1e9]), shuffle=st.randoms(),
       nominate=st.integers(0, 3))
def test_fair_share_of_given_jobs_is_the_order_built_whole(steps, tree, aging_s, shuffle, nominate):
    """``fair_share`` on a list of jobs (any order, readiness ignored), as tools call it."""
    world = World()
    for team, priority, gpus in steps:
        world.submit(team, priority, gpus, 1)
    jobs = [world.state.jobs[j] for j in world.state.pending]
    shuffle.shuffle(jobs)
    context = QueueContext(tree, {}, aging_s, frozenset(j.job_id for j in jobs[:nominate]))
    now = world.log.now
    assert [j.job_id for j in fair_share(world.state, jobs, now, context)] == \
        [j.job_id for j in fair_share_whole(world.state, jobs, now, context)]


def test_a_job_back_in_the_queue_is_offered_once():
    """A job that left the queue and came back before the next sync keeps one entry; one
    that left, was synced away, and came back gets a new one (the old never revives)."""
    world = World()
    world.submit("a", "training", 1, 3)
    queues = QueueKeys().fair_queues()
    now = world.log.now + 1000.0
    queues.sync(world.state, now, math.inf)
    world.place(0)                      # j1 runs: synced away
    queues.sync(world.state, now + 1, math.inf)
    world.fail(0)                       # ... and back, after its back-off
    now = world.log.now + 1000.0
    queues.sync(world.state, now, math.inf)
    order = [j.job_id for j in queues.order(world.state, now, QueueContext())]
    assert sorted(order) == ["j1", "j2", "j3"] and order == oracle(world.state, now, QueueContext())


def test_a_job_that_ages_between_cycles_moves_ahead_of_its_team():
    world = World()
    world.submit("a", "best-effort", 1, 1)       # j1
    world.submit("a", "training-high", 1, 1)     # j2, submitted after j1
    queues, context = TeamQueues(), QueueContext(aging_s=100.0)
    t1 = world.state.jobs["j1"].submitted_at
    for now, expected in ((t1 + 50, ["j2", "j1"]), (t1 + 100, ["j1", "j2"]), (t1 + 150, ["j1", "j2"])):
        queues.sync(world.state, now, 100.0)
        assert [j.job_id for j in queues.order(world.state, now, context)] == expected
        assert oracle(world.state, now, context) == expected


class WholeQueueForbidden(dict):
    """A pending set whose keys may not be listed: a sync that compares the whole queue fails."""

    def keys(self):
        raise AssertionError("the whole queue was compared")


def test_a_sync_reads_the_journal_not_the_whole_queue():
    world = World()
    world.submit("a", "training", 1, 6)
    world.submit("b", "training", 2, 3)
    queues, now = TeamQueues(), world.log.now + 1.0
    queues.sync(world.state, now, math.inf)   # the first sync loads the queue whole
    world.place(0)
    world.cancel(1)
    world.submit("c", "training", 1, 2)
    world.state.pending = WholeQueueForbidden(world.state.pending)
    queues.sync(world.state, now, math.inf)
    world.state.pending = dict(world.state.pending)
    assert [j.job_id for j in queues.order(world.state, now, QueueContext())] == \
        oracle(world.state, now, QueueContext())


def test_a_sync_past_an_overrun_journal_or_a_state_changed_behind_it_compares_the_whole_queue():
    world = World()
    world.submit("a", "training", 1, 6)
    queues, now = TeamQueues(), world.log.now + 1.0
    queues.sync(world.state, now, math.inf)
    world.place(0)
    world.submit("b", "training", 1, 1)   # as many waiting as before: only the journal tells
    world.state.changes_base += len(world.state.changes) + 10   # the entries since were dropped
    queues.sync(world.state, now, math.inf)
    assert [j.job_id for j in queues.order(world.state, now, QueueContext())] == \
        oracle(world.state, now, QueueContext())
    del world.state.pending["j3"]   # not through the reducer: the journal does not know
    queues.sync(world.state, now, math.inf)
    assert [j.job_id for j in queues.order(world.state, now, QueueContext())] == \
        oracle(world.state, now, QueueContext())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(st.lists(st.tuples(st.sampled_from(TEAMS[:2]), st.sampled_from(sorted(PRIORITY_CLASSES)),
                                           st.integers(0, 90)), max_size=4), min_size=2, max_size=6),
       take=st.integers(0, 40), tree=st.sampled_from(TREES))
def test_jobs_arriving_in_batches_into_long_queues_keep_the_order(batches, take, tree):
    """Batches of many jobs of a team at once, into team queues short and long: whether
    they are inserted one by one or the list is sorted again (``_insert`` chooses by the
    lengths), the order is the one built whole."""
    world, queues = World(), TeamQueues()
    for batch in batches:
        for team, priority, count in batch:
            world.submit(team, priority, 1, count)
        for _ in range(take):   # some jobs leave the queue's head
            world.place(0)
        now = world.log.now
        queues.sync(world.state, now, math.inf)
        context = QueueContext(tree)
        assert [j.job_id for j in queues.order(world.state, now, context)] == oracle(world.state, now, context)


def test_the_census_key_holds_every_field_of_a_shape():
    """The census and the shape numbers key by ``shape_key``: a field of ``WorkerResources``
    it left out would count two shapes as one (a field added to the dataclass must be added there);
    a topology request makes another shape (a gang that must stay in a rack may wait where
    the same gang without it fits)."""
    resources = WorkerResources(gpus=2, gpu_milli=0, mig_profile="", cpu_milli=3, memory_mib=4,
                                gpu_models=("a",), gpu_memory_mib=5)
    spec = dataclasses.replace(make_spec("a"), resources=resources, workers=3, pool="p")
    assert shape_key(spec) == ("p", 3, *dataclasses.astuple(resources))
    racked = dataclasses.replace(spec, topology=TopologyRequest(required="rack"))
    assert shape_key(racked) != shape_key(spec) and shape_key(racked)[0] == "p"
