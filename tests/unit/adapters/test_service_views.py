"""The API's view of a service (gpusched.adapters.api.views): counts, each replica with
its phase, readiness, endpoint and node, the rollout in words (stalled once its deadline
passed, by the clock it is given) and the endpoints in the order the replicas were made."""
from __future__ import annotations

import dataclasses

from gpusched.adapters.api.views import ROLLOUT_DEADLINE_S, endpoints_of, rollout_words, service_message
from gpusched.core import events as ev
from gpusched.core.model import Readiness, ServiceSpec
from gpusched.v1 import types_pb2
from tests.unit.core.builders import Log, make_node, make_spec, whole


def web(command: str = "v1") -> ServiceSpec:
    template = dataclasses.replace(make_spec(), command=("serve", command), serve_port=True,
                                   readiness=Readiness(http_path="/healthz"))
    return ServiceSpec(name="web", team="team-a", template=template, replicas=2, max_replicas=4)


def ready(log: Log, job_id: str, gpu: int) -> None:
    log.run(job_id, ("n1", whole(gpu)))
    out = log(ev.ReplicaReadiness, job_id=job_id, attempt=log.job(job_id).attempt, ready=True, address="10.0.0.1",
              port=9000 + gpu)
    assert out.accepted, out.reason


def test_a_service_with_one_replica_ready_and_one_pending():
    log = Log(make_node("n1", gpus=4))
    assert log(ev.ServiceApplied, spec=web()).accepted
    first, second = log.state.services["web"].replicas
    ready(log, first, 0)
    service = log.state.services["web"]
    msg = service_message(service, log.state, log.now)
    assert (msg.desired, msg.revision, msg.replicas, msg.updated, msg.ready) == (2, 1, 2, 2, 1)
    assert msg.spec.template.serve_port and msg.spec.template.readiness.http_path == "/healthz"
    assert msg.spec.max_replicas == 4 and msg.revisions == [1] and not msg.rollout_done
    one, two = msg.replica
    assert (one.job_id, one.phase, one.ready, one.endpoint, list(one.nodes)) == \
        (first, types_pb2.JOB_PHASE_RUNNING, True, "10.0.0.1:9000", ["n1"])
    assert (two.job_id, two.phase, two.ready, two.endpoint, list(two.nodes)) == \
        (second, types_pb2.JOB_PHASE_PENDING, False, "", [])
    assert msg.rollout == "rolling out revision 1: 2 of 2 updated, 1 ready"
    assert endpoints_of(service) == [(first, "10.0.0.1", 9000, 1)]

    ready(log, second, 1)
    assert rollout_words(service, log.now) == "complete"
    assert service_message(service, log.state, log.now).rollout_done
    assert [e[0] for e in endpoints_of(service)] == [first, second]     # in the order made


def test_a_rollout_not_done_by_its_deadline_is_stalled():
    log = Log(make_node("n1", gpus=4))
    log(ev.ServiceApplied, spec=web())
    for gpu, job_id in enumerate(list(log.state.services["web"].replicas)):
        ready(log, job_id, gpu)
    log(ev.ServiceApplied, spec=web("v2"))
    service = log.state.services["web"]
    began = service.rollout_at
    assert rollout_words(service, began + ROLLOUT_DEADLINE_S) == "rolling out revision 2: 1 of 2 updated, 2 ready"
    assert rollout_words(service, began + ROLLOUT_DEADLINE_S + 1) == \
        "stalled: revision 2 not ready after 600s (1 of 2 updated, 2 ready)"
