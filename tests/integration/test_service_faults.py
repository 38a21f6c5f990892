"""Services through faults, on a real broker with real model servers:

* a replica that is a gang of 2 workers on 2 nodes (a model spanning nodes) is placed all
  or nothing, served from its leader, and when one worker is killed the replica's whole
  attempt is restarted, both workers anew, and served again;
* kill -9 of admission and the placer in the middle of a rollout: new ones take the
  rollout up from the log and finish it, and by the log's own fold the service never had
  fewer ready replicas than max_unavailable 0 allows.
"""
from __future__ import annotations

import os
import signal

from gpusched.client import Client, spec
from gpusched.core import events as ev
from gpusched.core.reducer import apply
from gpusched.core.state import ClusterState
from gpusched.local_cluster import LocalCluster
from gpusched.v1 import types_pb2
from gpusched_node_agent.leftovers import worker_dir_name
from gpusched_node_agent.runner import STATUS_FILE, read_status
from tests.integration.cluster_calls import events_of
from tests.integration.logcheck import read_log
from tests.integration.service_rig import fetch, kill_workers_left, model_server
from tests.polling import eventually_async


def service(name: str, replicas: int, *args: str, workers: int = 1, gpus: int = 1, **fields) -> types_pb2.ServiceSpec:
    template = spec("", "", gpus=gpus, workers=workers, command=model_server(*args))
    template.serve_port = True
    template.readiness.http_path = "/healthz"
    template.readiness.period.FromMilliseconds(200)
    msg = types_pb2.ServiceSpec(name=name, team="ml", template=template, **fields)
    msg.replicas = replicas
    return msg


def pid_of(state_dir, job_id: str, attempt: int, worker: int) -> int:
    return read_status(state_dir / worker_dir_name(job_id, attempt, worker) / STATUS_FILE)["pid"]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_replica_spanning_two_nodes_is_placed_as_a_gang_and_restarted_as_a_unit(
        kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs")
    dirs = {n: tmp_path / n for n in ("node-0", "node-1")}
    try:
        admission = await cluster.admission()
        await cluster.placer()
        for name, state_dir in dirs.items():
            await cluster.agent(name, "2xH100-80GB", "--run-processes", "--state-dir", str(state_dir),
                                "--address", "127.0.0.1", "--grace", "2")
        client = Client(f"127.0.0.1:{admission.port}")
        await eventually_async(lambda: _nodes(client, 2), "both nodes registered", 30)
        await client.apply_service(service("big", 1, "--ready-after", "0.5", workers=2, gpus=2))
        await eventually_async(lambda: _ready(client, "big", 1), "the gang replica ready", 90)
        (replica,) = (await client.get_service("big")).replica
        job = await client.get(replica.job_id)
        assert sorted(w.node for w in job.workers) == ["node-0", "node-1"]   # both nodes, all or nothing
        leader = next(w.node for w in job.workers if w.worker == 0)
        assert (await fetch(replica.endpoint)).startswith(replica.job_id)
        assert job.rendezvous                                                 # a gang's rendezvous, as training's
        pids = {w.worker: pid_of(dirs[w.node], replica.job_id, job.attempt, w.worker) for w in job.workers}

        follower = next(w for w in job.workers if w.worker == 1)
        os.kill(pid_of(dirs[follower.node], replica.job_id, job.attempt, 1), signal.SIGKILL)
        await eventually_async(lambda: _ready_attempt(client, "big", replica.job_id, job.attempt + 1),
                               "the replica's next attempt ready", 90)
        again = await client.get(replica.job_id)
        assert again.attempt == job.attempt + 1 and again.restarts == 1
        assert not alive(pids[0]) and not alive(pids[1])                     # both workers of the old attempt gone
        new = {w.worker: pid_of(dirs[w.node], replica.job_id, again.attempt, w.worker) for w in again.workers}
        assert set(new) == {0, 1} and all(alive(p) for p in new.values())  # both started anew
        served = (await client.get_service("big")).replica[0]
        assert served.job_id == replica.job_id and (await fetch(served.endpoint)).startswith(replica.job_id)
        assert leader in {w.node for w in again.workers}
    finally:
        for state_dir in dirs.values():
            kill_workers_left(state_dir)
        await cluster.stop_all()


async def test_kill_9_of_admission_and_placer_mid_rollout_and_new_ones_finish_it(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs")
    state_dir = tmp_path / "node-0"
    update = types_pb2.UpdateStrategy(max_surge=1, max_unavailable=0)
    try:
        admission = await cluster.admission()
        placer = await cluster.placer()
        await cluster.agent("node-0", "4xH100-80GB", "--run-processes", "--state-dir", str(state_dir),
                            "--address", "127.0.0.1", "--grace", "2")
        client = Client(f"127.0.0.1:{admission.port}")
        await eventually_async(lambda: _nodes(client, 1), "the node registered", 30)
        await client.apply_service(service("web", 3, "--ready-after", "0.3", update=update))
        await eventually_async(lambda: _ready(client, "web", 3), "3 replicas ready", 90)

        rolling = await client.apply_service(service("web", 3, "--version", "v2", "--ready-after", "2", update=update))
        assert rolling.revision == 2 and not rolling.rollout_done
        await admission.kill9()
        await placer.kill9()
        await client.close()
        admission = await cluster.admission("admission-2")
        await cluster.placer("placer-2")
        client = Client(f"127.0.0.1:{admission.port}")
        await eventually_async(lambda: _rolled_out(client, "web", 2), "the rollout finished by the new ones", 120)
        done = await client.get_service("web")
        for replica in done.replica:
            assert await fetch(replica.endpoint) == f"{replica.job_id} v2\n"

        # by the log's own fold: never fewer than 3 ready once 3 were, through both kills
        fewest, seen_three = None, False
        state = ClusterState()
        for event in events_of(await read_log(kafka_bootstrap, topics)):
            apply(state, event)
            ready = len(state.services["web"].ready) if "web" in state.services else 0
            seen_three = seen_three or ready == 3
            if seen_three and isinstance(event, (ev.ReplicaReadiness, ev.WorkerFinished, ev.ServiceApplied)):
                fewest = ready if fewest is None else min(fewest, ready)
        assert seen_three and fewest == 3
    finally:
        kill_workers_left(state_dir)
        await cluster.stop_all()


async def _nodes(client: Client, count: int) -> bool:
    return len(await client.nodes()) == count


async def _ready(client: Client, name: str, count: int) -> bool:
    return (await client.get_service(name)).ready == count


async def _ready_attempt(client: Client, name: str, job_id: str, attempt: int) -> bool:
    service = await client.get_service(name)
    job = await client.get(job_id)
    return service.ready == 1 and job.attempt == attempt and job.phase == types_pb2.JOB_PHASE_RUNNING


async def _rolled_out(client: Client, name: str, revision: int) -> bool:
    service = await client.get_service(name)
    return (service.revision == revision and service.rollout_done and service.ready == service.desired
            and all(r.revision == revision for r in service.replica))
