"""Why pending: one row per reason, with the exact node counts, and the per-node filter
that says "fits" exactly when the fit rule does."""
from __future__ import annotations

import dataclasses
from typing import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.core.model import NodeStatus, PendingKind, WorkerResources
from gpusched.policies.gpu_fit import first_failing, fit
from gpusched.policies.memory import CycleMemory
from gpusched.policies.placement.diagnosis import Diagnosis, diagnose
from gpusched.policies.queueing.quota import QueueTree
from gpusched.policies.scheduler import Scheduler, SchedulerConfig, Unplaced
from tests.unit.core.builders import Log, make_node, make_spec, whole, workers
from tests.unit.core.fit_cases import build, gpu_st, requests

NOW = 100.0


class Case:
    """Nodes n1..nN (4 H100s each); jobs run with ``run``, the one asked about is ``job``."""

    def __init__(self, nodes: int = 3, **node_kw) -> None:
        self.log = Log(*(make_node(f"n{i + 1}", **node_kw) for i in range(nodes)))
        self.state = self.log.state
        self.n = 0
        self.quotas = QueueTree()
        self.cycle = None   # the cycle's result, where a row runs one
        self.decisions: list = []

    def run(self, node: str, gpus: int, team: str = "other", **spec_kw) -> str:
        job_id = self.submit(make_spec(team, gpus=gpus, **spec_kw))
        assert self.log(ev.JobPlaced, job_id=job_id, attempt=0, workers=workers((node, whole(*range(gpus))))).accepted
        return job_id

    def submit(self, spec) -> str:
        self.n += 1
        job_id = f"j{self.n}"
        assert self.log(ev.JobSubmitted, job_id=job_id, spec=spec).accepted
        return job_id

    def job(self, **spec_kw) -> str:
        spec_kw.setdefault("gpus", 4)
        return self.submit(make_spec("t", **spec_kw))

    def ask(self, job_id: str):
        return diagnose(self.state, self.state.jobs[job_id], NOW, CycleMemory(), self.quotas, self.cycle, self.decisions)

    def running_until(self, node: str, gpus: int, runtime: float, name: str = "busy", team: str = "other") -> str:
        """A running job of ``gpus`` GPUs on ``node`` expected to end ``runtime`` s after it
        started (0: no time limit, expected to run the default estimate)."""
        job_id = self.submit(dataclasses.replace(make_spec(team, gpus=gpus, name=name), max_runtime_s=runtime))
        self.log(ev.JobPlaced, job_id=job_id, attempt=0, workers=workers((node, whole(*range(gpus)))))
        self.log(ev.WorkerStarted, job_id=job_id, attempt=0, worker=0, node=node)
        return job_id


def busy(c: Case, *nodes: str) -> None:
    for node in nodes:
        c.run(node, 4)


def no_fit_gpus(c: Case) -> str:
    busy(c, "n1", "n2")
    c.run("n3", 2)
    return c.job()


def mixed(c: Case) -> str:
    c.log(ev.NodeRegistered, node=make_node("n4"))
    busy(c, "n1", "n2")
    c.log(ev.NodeCordoned, node="n3")
    c.log(ev.NodeLost, node="n4")
    return c.job()


def model(c: Case) -> str:
    return c.job(models=("A100-80GB",))


def share(c: Case) -> str:
    busy(c, "n1", "n2", "n3")
    return c.job(gpus=0, milli=500)


def mig(c: Case) -> str:
    busy(c, "n1", "n2", "n3")
    return c.job(gpus=0, mig="3g.40gb")


def cpu(c: Case) -> str:
    return c.job(cpu=20_000)


def memory(c: Case) -> str:
    return c.job(mem=100_000)


def empty_pool(c: Case) -> str:
    c.log(ev.PoolCreated, pool="empty")
    return c.job(pool="empty")


def team_quota(c: Case) -> str:
    c.quotas = QueueTree.from_dict({"orgs": {"o": {"teams": {"t": {"limit_gpus": 6}}}}})
    c.run("n1", 4, team="t")
    return c.job()


def org_quota(c: Case) -> str:
    c.quotas = QueueTree.from_dict({"orgs": {"o": {"limit_gpus": 6, "teams": {"t": {}, "u": {}}}}})
    c.run("n1", 4, team="u")
    return c.job()


def backoff(c: Case) -> str:
    job_id = c.job()
    c.state.jobs[job_id].not_before = NOW + 30
    c.state.jobs[job_id].restarts = 1
    return job_id


def gang(c: Case) -> str:
    c.run("n3", 2)
    return c.job(workers=3)


def queued(c: Case) -> str:
    busy(c, "n1")
    return c.job()


def taken_by_this_cycle(c: Case) -> str:
    """n3 fits it in the log's state, but the cycle just gave n3 to another job."""
    busy(c, "n1", "n2")
    other = c.job()
    c.decisions = [(c.state.jobs[other], workers(("n3", whole(0, 1, 2, 3))))]
    return c.job()


def nomination(c: Case) -> str:
    """n2's running job is being preempted for j4; n2 still has 2 free GPUs, kept for it (j4)."""
    busy(c, "n1", "n3")
    victim = c.run("n2", 2)
    beneficiary = c.job()
    assert c.log(ev.JobPreempted, job_id=victim, attempt=0, for_job=beneficiary, time=NOW - 1).accepted
    return c.job(gpus=1)


def reservation(c: Case) -> str:
    """A 2x4-GPU gang is blocked (n1 busy until 1000): EASY backfill reserves n1 and n3
    (n2 runs for ever); a job of unknown runtime behind it may not use n3's free GPUs."""
    for node, runtime in (("n1", 1000.0), ("n2", 0.0)):
        c.running_until(node, 4, runtime)
    head = c.submit(dataclasses.replace(make_spec("t", gpus=4, workers=2, name="head"), max_runtime_s=100.0))
    later = c.job(gpus=1)
    c.cycle = Scheduler(SchedulerConfig(queue="fifo", backfill=True)).schedule(c.state, NOW, CycleMemory())
    assert c.cycle.decisions == [] and [r.job.job_id for r in c.cycle.reservations] == [head]
    return later


def two_reservations(c: Case) -> str:
    """Two blocked 4-GPU jobs each reserve a node whose 2 free GPUs their holds take (j4
    n3 from 500, j5 n1 from 1000: n3 is j4's until 1500); a 2-GPU job of unknown runtime
    behind them would delay both, and is told of both."""
    c.running_until("n1", 2, 1000.0)
    c.running_until("n2", 4, 0.0)
    c.running_until("n3", 2, 500.0)
    first = c.submit(dataclasses.replace(make_spec("t", gpus=4, name="head"), max_runtime_s=1000.0))
    second = c.submit(dataclasses.replace(make_spec("t", gpus=4, name="second"), max_runtime_s=100.0))
    later = c.job(gpus=2)
    config = SchedulerConfig(queue="fifo", backfill=True, reserve_after_s=0.0, reservation_depth=2)
    c.cycle = Scheduler(config).schedule(c.state, NOW, CycleMemory())
    assert [r.job.job_id for r in c.cycle.reservations] == [first, second]
    assert c.cycle.reason(later) is Unplaced.HELD_FOR_RESERVATION
    return later


def the_second_reservation_is_its_own(c: Case) -> str:
    """The job asked about holds the pool's second reservation: the first does not block
    it (it would end before j4's starts), and the summary says it holds one."""
    two_reservations(c)
    return "j5"


def guarantee_hold(c: Case) -> str:
    """Team g, guaranteed 8 GPUs and using none, waits with a 2x4 gang that does not fit
    now; team t, with no guarantee, would borrow n3's last free GPU for a 1-GPU job: the
    cycle holds it back for g (12 GPUs, 8 in use, 1 more would leave 3 < 8)."""
    c.quotas = QueueTree.from_dict({"orgs": {"o": {"teams": {"g": {"guaranteed_gpus": 8}, "t": {}}}}})
    busy(c, "n1", "n2")
    c.submit(make_spec("g", gpus=4, workers=2))
    job_id = c.job(gpus=1)
    c.cycle = Scheduler(SchedulerConfig(queue="fifo", quotas=c.quotas, reservation_depth=0)).schedule(c.state, NOW, CycleMemory())
    assert c.cycle.reason(job_id) is Unplaced.HELD_FOR_GUARANTEE
    return job_id


ROWS: list[tuple[str, Callable[[Case], str], PendingKind, dict[str, int], str]] = [
    ("gpus", no_fit_gpus, PendingKind.NO_FIT, {"gpus": 3},
     "0/3 nodes are available: 3 not enough free GPUs."),
    ("lost, cordoned, gpus", mixed, PendingKind.NO_FIT, {"gpus": 2, "lost": 1, "cordoned": 1},
     "0/4 nodes are available: 2 not enough free GPUs, 1 lost, 1 cordoned."),
    ("model", model, PendingKind.NO_FIT, {"model": 3},
     "0/3 nodes are available: 3 without an allowed GPU model."),
    ("share", share, PendingKind.NO_FIT, {"share": 3},
     "0/3 nodes are available: 3 no GPU with room for the share."),
    ("mig", mig, PendingKind.NO_FIT, {"mig": 3},
     "0/3 nodes are available: 3 no free 3g.40gb MIG slice."),
    ("cpu", cpu, PendingKind.NO_FIT, {"cpu": 3},
     "0/3 nodes are available: 3 not enough free CPU."),
    ("memory", memory, PendingKind.NO_FIT, {"memory": 3},
     "0/3 nodes are available: 3 not enough free memory."),
    ("pool without nodes", empty_pool, PendingKind.NO_FIT, {}, "pool empty has no nodes."),
    ("team quota", team_quota, PendingKind.QUOTA, {},
     "team t would go over its GPU limit: 4 in use + 4 asked > 6."),
    ("org quota", org_quota, PendingKind.QUOTA, {},
     "org o would go over its GPU limit: 4 in use + 4 asked > 6."),
    ("back-off", backoff, PendingKind.BACKOFF, {},
     "retry back-off after 1 failure(s): not offered before 00:02:10 UTC"),
    ("gang", gang, PendingKind.GANG, {"fits": 2, "gpus": 1},
     "gang of 3 workers, room for 2 now; 2/3 nodes are available: 1 not enough free GPUs."),
    ("fits", queued, PendingKind.QUEUED, {"fits": 2, "gpus": 1},
     "fits on 2/3 nodes; waits for its turn in a cycle."),
    ("the cycle's decisions", taken_by_this_cycle, PendingKind.NO_FIT, {"gpus": 3},
     "0/3 nodes are available: 3 not enough free GPUs."),
    ("nomination", nomination, PendingKind.NOMINATION, {"gpus": 2, "nominated": 1},
     "fits, but nodes freed by preemption are kept for j4; 0/3 nodes are available: "
     "2 not enough free GPUs, 1 kept for a preemption's beneficiary."),
    ("reservation", reservation, PendingKind.RESERVATION, {"gpus": 2, "reserved": 1},
     "fits, but job j3 holds a backfill reservation; 0/3 nodes are available: "
     "2 not enough free GPUs, 1 held for a backfill reservation."),
    ("every reservation it is blocked by", two_reservations, PendingKind.RESERVATION, {"gpus": 1, "reserved": 2},
     "fits, but 2 backfill reservations hold its room: job j4's on 1 node, job j5's on 1 node; "
     "0/3 nodes are available: 2 held for a backfill reservation, 1 not enough free GPUs."),
    ("its own reservation and an earlier one", the_second_reservation_is_its_own, PendingKind.NO_FIT,
     {"gpus": 3}, "0/3 nodes are available: 3 not enough free GPUs. Capacity is reserved for it (backfill)."),
    ("guarantee hold", guarantee_hold, PendingKind.GUARANTEE, {"fits": 1, "gpus": 2},
     "fits on 1/3 nodes, but team t would borrow GPUs kept back for teams waiting below their guarantee "
     "(guarantee hold)."),
]


@pytest.mark.parametrize("name, setup, kind, counts, summary", ROWS, ids=[r[0] for r in ROWS])
def test_each_reason_with_its_counts(name, setup, kind, counts, summary):
    c = Case()
    job_id = setup(c)
    before = digest(c.state)
    reason = c.ask(job_id)
    assert (reason.kind, {x.filter: x.nodes for x in reason.counts}, reason.summary) == (kind, counts, summary)
    assert digest(c.state) == before   # booked decisions and holds are undone


def test_jobs_of_one_shape_are_looked_at_once():
    c = Case()
    busy(c, "n1", "n2", "n3")
    jobs = [c.state.jobs[c.job()] for _ in range(3)] + [c.state.jobs[c.job(gpus=1)]]
    with Diagnosis(c.state, NOW, CycleMemory(), QueueTree()) as diagnosis:
        found = [diagnosis.diagnose(job) for job in jobs]
        assert len(diagnosis._by_shape) == 2
    assert found[0] is found[1] is found[2] and found[3].counts == found[0].counts


# --- the per-node filter and the fit rule ------------------------------------------------------
@settings(max_examples=600, deadline=None)
@given(gpus=st.lists(gpu_st, min_size=1, max_size=2), node_model=st.sampled_from(["H100-80GB", "L40S-48GB"]),
       dynamic=st.booleans(), request=requests, status=st.sampled_from(list(NodeStatus)),
       pool=st.sampled_from(["default", "other"]), free_cpu=st.sampled_from([0, 500, 64_000]),
       free_mem=st.sampled_from([0, 1000, 512_000]), models=st.sampled_from([(), ("H100-80GB",), ("A100-80GB",)]),
       whole_gpus=st.integers(0, 2), cpu=st.sampled_from([0, 1000]), mem=st.sampled_from([0, 2000]))
def test_first_failing_says_fits_exactly_when_the_fit_rule_does(gpus, node_model, dynamic, request, status, pool,
                                                                 free_cpu, free_mem, models, whole_gpus, cpu, mem):
    node = build(gpus, node_model, dynamic).nodes["n1"]
    node.status = status
    node.used_cpu = node.info.cpu_milli - free_cpu
    node.used_mem = node.info.memory_mib - free_mem
    kind, a, b = request
    shape = {"whole": dict(gpus=whole_gpus), "share": dict(gpu_milli=a, gpu_memory_mib=b), "mig": dict(mig_profile=a)}
    res = WorkerResources(cpu_milli=cpu, memory_mib=mem, gpu_models=models, **shape[kind])
    failing = first_failing(node, pool, res)
    assert (failing == "") == (fit(node, pool, res) is not None), failing
