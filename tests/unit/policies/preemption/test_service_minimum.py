"""Preemption never takes a service below its ``min_replicas``
(``core.services.keeps_minimum``): the search leaves such replicas out, shielded as
``service-minimum``, also across the victims of one set, and the reducer refuses a
``JobPreempted`` that would do it."""
from __future__ import annotations

import dataclasses

from gpusched.core import events as ev
from gpusched.core.model import JobPhase, ServiceSpec
from gpusched.policies.memory import CycleMemory
from gpusched.policies.preemption.decisions import preemption_decisions, why_no_victims
from tests.unit.core.builders import make_spec, whole
from tests.unit.policies.preemption_clusters import BE, HI, NOW, Cluster
from tests.unit.policies.preemption_configs import other_rules


def serving(min_replicas: int) -> Cluster:
    """One node of 4 GPUs, all held by the 4 running replicas of a preemptible best-effort
    service."""
    c = Cluster(nodes=1, gpus=4)
    template = dataclasses.replace(make_spec(gpus=1, cpu=0, mem=0), preemptible=True)
    spec = ServiceSpec(name="cheap", team="team-b", template=template, priority_class=BE, preemptible=True,
                       replicas=4, min_replicas=min_replicas)
    assert c.log(ev.ServiceApplied, spec=spec, time=NOW - 2000).accepted
    for gpu, job_id in enumerate(c.state.services["cheap"].replicas):
        assert c.log(ev.JobPlaced, job_id=job_id, attempt=0, time=NOW - 1000,
                     workers=(ev.WorkerAssignment(0, "n1", whole(gpu)),)).accepted
        assert c.log(ev.WorkerStarted, job_id=job_id, attempt=0, worker=0, node="n1", time=NOW - 1000).accepted
    return c


def decide(c: Cluster):
    return preemption_decisions(c.state, NOW, CycleMemory(), other_rules())


def test_a_preemption_takes_replicas_only_down_to_the_minimum():
    c = serving(min_replicas=3)
    c.pending("urgent", priority_class=HI, gpus=1, at=NOW - 3000)
    (one,) = decide(c)
    assert len(one.victims) == 1 and c.job(one.victims[0]).spec.service == "cheap"


def test_no_set_of_victims_goes_below_the_minimum():
    c = serving(min_replicas=3)
    c.pending("urgent", priority_class=HI, gpus=2, at=NOW - 3000)   # 2 GPUs: only 1 replica may go
    assert decide(c) == []
    c2 = serving(min_replicas=2)
    c2.pending("urgent", priority_class=HI, gpus=2, at=NOW - 3000)
    (two,) = decide(c2)
    assert len(two.victims) == 2


def test_replicas_at_the_minimum_are_shielded_and_say_so():
    c = serving(min_replicas=4)
    c.pending("urgent", priority_class=HI, gpus=1, at=NOW - 3000)
    assert decide(c) == []
    shields = why_no_victims(c.state, c.job("urgent"), NOW, CycleMemory(), other_rules())
    assert "4 service-minimum" in shields.summary(), shields.summary()


def test_the_reducer_refuses_a_preemption_below_the_minimum():
    c = serving(min_replicas=3)
    first, second = list(c.state.services["cheap"].replicas)[:2]
    assert c.log(ev.JobPreempted, job_id=first, attempt=0, for_job="x", reason="priority", time=NOW).accepted
    out = c.log(ev.JobPreempted, job_id=second, attempt=0, for_job="x", reason="priority", time=NOW)
    assert not out.accepted and "below its min_replicas" in out.reason
    assert c.job(second).phase is JobPhase.RUNNING
