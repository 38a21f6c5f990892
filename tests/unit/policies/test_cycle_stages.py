"""The cycle's stages (``gpusched.policies.scheduler``): every job offered and not placed
comes back with why (``Unplaced``), and the placement policy's arguments reach it."""
from __future__ import annotations

import math

import argparse

import pytest

from gpusched.config import PlacerSettings, SettingsError
from gpusched.core import events as ev
from gpusched.policies.memory import CycleMemory
from gpusched.policies.placement.registry import parse_placement
from gpusched.policies.queueing.quota import OrgQuota, QueueTree, TeamQuota
from gpusched.policies.scheduler import Scheduler, SchedulerConfig, Unplaced
from gpusched.sim.dynamic_configs import parse_config
from tests.unit.core.builders import Log, make_node, make_spec, whole
from tests.unit.policies.backfill_clusters import NOW, gang_behind_busy_cluster


def busy_node() -> Log:
    """One 2-GPU node with one GPU taken by team t (limit: 1 GPU); waiting, in order: two
    2-GPU jobs, one more of team t, one 1-GPU job."""
    log = Log(make_node("n1", 2))
    log.submit("run", make_spec("t", gpus=1))
    log.run("run", ("n1", whole(0)))
    log.submit("big", make_spec("u", gpus=2))
    log.submit("big2", make_spec("u", gpus=2))
    log.submit("over", make_spec("t", gpus=1))
    log.submit("small", make_spec("u", gpus=1))
    return log


LIMITED = QueueTree(orgs={"o": OrgQuota(teams={"t": TeamQuota(limit_gpus=1)})})
# No reservation stage: a failure depends on free capacity alone (parking, skipped shapes).
NO_RESERVATIONS = {"backfill": False, "reserve_after_s": math.inf}


def test_each_job_not_placed_has_its_reason_then_is_parked():
    log, memory = busy_node(), CycleMemory()
    scheduler = Scheduler(SchedulerConfig(queue="fifo", quotas=LIMITED, **NO_RESERVATIONS))
    result = scheduler.schedule(log.state, log.now, memory)
    assert [d.job_id for d in result.decisions] == ["small"]
    assert result.unplaced == {"big": Unplaced.NO_FIT, "big2": Unplaced.SKIPPED_SAME_SHAPE,
                               "over": Unplaced.QUOTA}
    [small] = result.decisions
    assert log(ev.JobPlaced, job_id="small", attempt=0, workers=small.workers).accepted
    again = scheduler.schedule(log.state, log.now, memory)
    assert again.unplaced == {}
    assert {j: again.reason(j) for j in ("big", "big2", "over", "small")} == {
        "big": Unplaced.PARKED, "big2": Unplaced.PARKED, "over": Unplaced.PARKED, "small": None}


def test_without_keys_every_job_is_tried_and_fails_alike():
    log = busy_node()
    result = Scheduler(SchedulerConfig(queue="fifo", **NO_RESERVATIONS)).schedule(log.state, log.now, CycleMemory())
    assert [d.job_id for d in result.decisions] == ["over"]   # no quota: the first 1-GPU job
    assert result.unplaced == {"big": Unplaced.NO_FIT, "big2": Unplaced.SKIPPED_SAME_SHAPE,
                               "small": Unplaced.NO_FIT}


def test_a_job_that_only_the_reservation_keeps_out_is_held_for_it():
    c = gang_behind_busy_cluster()
    c.pending("small", 6_000, gpus=4)   # n2's 4 free GPUs would take it, past the shadow time
    scheduler = Scheduler(SchedulerConfig(queue="fifo", backfill=True))
    result = scheduler.schedule(c.state, NOW, CycleMemory())
    assert result.decisions == []
    assert result.unplaced == {"gang": Unplaced.NO_FIT, "small": Unplaced.HELD_FOR_RESERVATION}
    assert result.reservation.job.job_id == "gang" and scheduler.reservation is result.reservation


def test_a_job_kept_off_a_nominees_nodes_says_so():
    log = Log(make_node("n1", 1))
    log.submit("run", gpus=1)
    log.run("run", ("n1", whole(0)))
    log.submit("nominee", gpus=1)
    log.submit("other", gpus=1, cpu=2000)   # another shape: tried, not skipped
    assert log(ev.JobPreempted, job_id="run", attempt=0, for_job="nominee", reason="test").accepted
    result = Scheduler(SchedulerConfig(queue="fifo", **NO_RESERVATIONS)).schedule(log.state, log.now, CycleMemory())
    assert result.unplaced == {"nominee": Unplaced.NO_FIT, "other": Unplaced.HELD_FOR_NOMINEE}


def test_the_placement_policys_arguments_reach_it():
    scheduler = Scheduler(SchedulerConfig(placement="fgd-lookahead", placement_args={"patience": 0.5}))
    assert scheduler._placement.patience == 0.5


@pytest.mark.parametrize("placement, args, named", [
    ("fgd", {"patience": 0.5}, "'patience'"),          # FGD takes popularity only
    ("best-fit", {"popularity": 0.5}, "'popularity'"),
    ("fgd-lookahead", {"patience": -1.0}, "patience"),  # out of range
])
def test_a_bad_placement_argument_is_refused_by_name(placement, args, named):
    with pytest.raises(ValueError, match=named):
        Scheduler(SchedulerConfig(placement=placement, placement_args=args))


def test_the_placers_placement_args_come_from_a_repeated_flag():
    parser = argparse.ArgumentParser()
    PlacerSettings.add_args(parser, {})
    settings = PlacerSettings.from_args(parser.parse_args(
        ["--placement", "fgd-lookahead", "--placement-arg", "patience=0.2", "--placement-arg", "popularity=0.9"]), {})
    assert settings.placement_args == {"patience": 0.2, "popularity": 0.9}
    assert PlacerSettings.from_args(parser.parse_args([]), {}).placement_args == {}
    for bad, named in ((["--placement-arg", "patience"], "expected KEY=VALUE"),
                       (["--placement-arg", "patience=lots"], "valid number")):
        with pytest.raises(SettingsError, match=f"--placement-arg: .*{named}"):
            PlacerSettings.from_args(parser.parse_args(bad), {})


def test_the_simulators_name_a_policys_arguments_after_it():
    _, config = parse_config("fifo+fgd-lookahead:patience=0.2+backfill", QueueTree(), 3600, 3600)
    assert (config.placement, config.placement_args, config.backfill) == ("fgd-lookahead", {"patience": 0.2}, True)
    with pytest.raises(ValueError, match="no argument 'patience'"):
        parse_config("fifo+fgd:patience=0.2", QueueTree(), 3600, 3600)
    with pytest.raises(ValueError, match="must be a number"):
        parse_placement("fgd:popularity=most")


def test_the_synthetic_workload_splits_gangs_into_workers_of_the_size_asked():
    """``--worker-gpus 4``: the same jobs, gangs of 4-GPU workers (for gang placement runs)."""
    from gpusched.sim.synthetic import synthetic_workload
    whole = synthetic_workload(0, horizon_s=4 * 3600, h100_nodes=6, l40s_nodes=2, flood_jobs=5)
    halves = synthetic_workload(0, horizon_s=4 * 3600, h100_nodes=6, l40s_nodes=2, flood_jobs=5, worker_gpus=4)
    assert [a.job_id for a in whole.arrivals] == [a.job_id for a in halves.arrivals]
    for a, b in zip(whole.arrivals, halves.arrivals):
        assert a.spec.total_milli == b.spec.total_milli
        assert b.spec.resources.gpus <= 4 and (b.spec.workers > 1) == (a.spec.total_milli > 4000)
