"""What a worker's environment says about its gang: torchrun's variables and the node list."""
from __future__ import annotations

from dataclasses import replace

from gpusched.core import events as ev
from gpusched_node_agent.launch_env import node_addresses, worker_env
from tests.unit.core.builders import Log, make_node, whole


def _gang() -> Log:
    log = Log(*(replace(make_node(name, 2), address=f"10.0.0.{i}") for i, name in enumerate(("a", "b"), 1)))
    log.submit("g", workers=3)
    log.run("g", ("b", whole(0)), ("a", whole(0)), ("b", whole(1)))   # workers 0 and 2 share node b
    log(ev.RendezvousSet, job_id="g", attempt=0, node="b", address="10.0.0.2", port=29511)
    return log


def test_ranks_nodes_and_rendezvous_of_a_gang_spread_over_two_nodes():
    log = _gang()
    job = log.job("g")
    envs = [worker_env(job, w, node_addresses(job, log.state.nodes), job.rendezvous) for w in range(3)]
    assert [e["RANK"] for e in envs] == ["0", "1", "2"]
    assert {e["WORLD_SIZE"] for e in envs} == {"3"}
    assert [e["NODE_RANK"] for e in envs] == ["0", "1", "0"]          # node b holds rank 0
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "0", "1"]
    assert [e["LOCAL_WORLD_SIZE"] for e in envs] == ["2", "1", "2"]
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {("10.0.0.2", "29511")}
    assert {e["GPUSCHED_NODELIST"] for e in envs} == {"b,a"}
    assert {e["GPUSCHED_NODE_ADDRESSES"] for e in envs} == {"10.0.0.2,10.0.0.1"}
    assert {e["GPUSCHED_NNODES"] for e in envs} == {"2"}
    assert {e["GPUSCHED_RDZV_ID"] for e in envs} == {"g-0"}


def test_a_restarted_gang_gets_a_new_rendezvous_id():
    log = _gang()
    log.finish("g", 1, 1)
    log.stopped("g")
    log.run("g", ("a", whole(0)), ("a", whole(1)), ("b", whole(0)))
    log(ev.RendezvousSet, job_id="g", attempt=1, node="a", address="10.0.0.1", port=29600)
    job = log.job("g")
    env = worker_env(job, 2, node_addresses(job, log.state.nodes), job.rendezvous)
    assert env["GPUSCHED_RDZV_ID"] == "g-1" and env["MASTER_PORT"] == "29600" and env["NODE_RANK"] == "1"
