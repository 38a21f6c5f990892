"""What a worker's environment says about its gang: torchrun's variables and the node list."""
from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

from gpusched.core import events as ev
from gpusched_node_agent.launch_env import node_addresses, service_env, worker_env
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


TORCHRUN = """#!/bin/sh
# torchrun as the worked example calls it: its arguments, one per line, and no run
printf '%s\\n' "$@" > "$TORCHRUN_ARGS"
"""


def _worked_example() -> list[str]:
    """The command of docs/guide/workloads.md's worked example (its job.json)."""
    text = (Path(__file__).resolve().parents[3] / "docs" / "guide" / "workloads.md").read_text()
    block = text.split("# job.json for grpcurl (SubmitJob)\n", 1)[1].split("```", 1)[0]
    return json.loads(block)["spec"]["command"]


def test_the_torchrun_example_gives_ranks_by_node_rank(tmp_path):
    """The example's torchrun gets a static rendezvous at the gang's rendezvous and each
    node's rank: global rank 0 on worker 0's node. (c10d would ignore --node-rank and rank
    nodes by arrival.)"""
    (tmp_path / "torchrun").write_text(TORCHRUN)
    (tmp_path / "torchrun").chmod(0o755)
    command = _worked_example()
    log = Log(*(replace(make_node(name, 8), address=f"10.0.0.{i}") for i, name in enumerate(("a", "b"), 1)))
    log.submit("g", workers=2, gpus=8)
    log.run("g", ("b", whole(*range(8))), ("a", whole(*range(8))))
    log(ev.RendezvousSet, job_id="g", attempt=0, node="b", address="10.0.0.2", port=29511)
    job = log.job("g")
    ranks = {}
    for worker in (0, 1):
        env = worker_env(job, worker, node_addresses(job, log.state.nodes), job.rendezvous)
        args_file = tmp_path / f"args-{worker}"
        subprocess.run(command, env={**env, "PATH": f"{tmp_path}:/usr/bin:/bin", "TORCHRUN_ARGS": str(args_file)},
                       check=True, timeout=30)
        args = dict(a.removeprefix("--").split("=", 1) for a in args_file.read_text().splitlines() if "=" in a)
        assert args.get("rdzv-backend", "static") == "static", args   # c10d ranks by arrival, not node rank
        assert (args["master-addr"], args["master-port"]) == ("10.0.0.2", "29511")   # worker 0's node
        assert args["nnodes"] == "2"
        node_rank, per_node = int(args["node-rank"]), int(args["nproc-per-node"])
        ranks[job.workers[worker].node] = range(node_rank * per_node, (node_rank + 1) * per_node)
    assert 0 in ranks["b"] and set(ranks["a"]) | set(ranks["b"]) == set(range(16))


def test_a_replica_is_told_its_service_its_id_and_its_port():
    log = Log(make_node("n1"))
    log.submit("r1")
    job = log.job("r1")
    assert service_env(job, 8123) == {}                       # not a service's replica
    replica = replace(job, spec=replace(job.spec, service="web", serve_port=True))
    assert service_env(replica, 8123) == {"GPUSCHED_SERVICE": "web", "GPUSCHED_REPLICA": "r1", "PORT": "8123"}
    assert service_env(replica) == {"GPUSCHED_SERVICE": "web", "GPUSCHED_REPLICA": "r1"}
