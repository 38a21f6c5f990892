"""Retries by cause with real worker processes (docs/guide/workloads.md, "Retries by cause"):
a command whose exit code a rule marks fatal fails at once, without its restarts; an
exit no rule names is retried against max_restarts; a worker the kernel's out-of-memory
killer ends is told apart (a memory cgroup of 64 MiB, where the machine has cgroup v1's
memory controller and the test runs as root); a node lost under a job places it again
without counting, even with no restarts to spend. What each attempt was, the workloads
record themselves (``tests/workloads/recorder.py``)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import grpc
import pytest

from gpusched.client import Client, spec
from gpusched.local_cluster import LocalCluster
from gpusched.v1 import types_pb2
from tests.integration.cluster_calls import until
from tests.workloads.intervals import read_records

WORKLOADS = Path(__file__).resolve().parents[1] / "workloads"
RECORDER = (sys.executable, str(WORKLOADS / "recorder.py"))
RUNNING, SUCCEEDED, FAILED = types_pb2.JOB_PHASE_RUNNING, types_pb2.JOB_PHASE_SUCCEEDED, types_pb2.JOB_PHASE_FAILED
EXIT, OOM, NODE = types_pb2.FAILURE_CAUSE_EXIT, types_pb2.FAILURE_CAUSE_OOM, types_pb2.FAILURE_CAUSE_NODE
MEMCG = Path("/sys/fs/cgroup/memory")
# What PyTorch prints when a CUDA allocation fails, then exits 1 (an uncaught exception).
CUDA_OOM = ("import sys; print('step 1: loss 2.31', flush=True); sys.stderr.write("
            "'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
            "capacity of 79.11 GiB of which 1.02 GiB is free.\\n'); sys.exit(1)")
CAN_OOM = os.geteuid() == 0 and (MEMCG / "memory.limit_in_bytes").exists()


async def agent(cluster: LocalCluster, node: str, tmp_path: Path, gpus: int):
    return await cluster.agent(node, f"{gpus}xH100-80GB", "--run-processes", "--state-dir", str(tmp_path / node),
                               "--lease", "2", "--grace", "1", "--heartbeat-interval", "0.3",
                               "--address", "127.0.0.1")


def with_rules(job: types_pb2.JobSpec, *rules: dict, max_restarts: int) -> types_pb2.JobSpec:
    job.max_restarts = max_restarts
    for rule in rules:
        job.retry.add(**rule)
    return job


def attempts_recorded(root: Path, job_id: str) -> set[int]:
    return {i.attempt for i in read_records(root) if i.job == job_id}


async def test_failures_are_retried_by_their_cause(kafka_bootstrap, topics, tmp_path):
    cgroup = MEMCG / f"gpusched-test-{os.getpid()}"
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs")
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await cluster.preemptor("preemptor", "--heartbeat-timeout", "2")
        doomed = await agent(cluster, "node-0", tmp_path, gpus=4)
        client = Client(f"127.0.0.1:{admission.port}")
        fatal = with_rules(spec("typo", "ml", gpus=1, command=(*RECORDER, "--duration", "0.2", "--exit", "2")),
                           {"cause": EXIT, "exit_codes": [2], "action": types_pb2.RETRY_ACTION_FAIL}, max_restarts=3)
        flaky = with_rules(spec("flaky", "ml", gpus=1, command=(*RECORDER, "--duration", "0.2", "--exit", "1")),
                           {"cause": EXIT, "exit_codes": [2], "action": types_pb2.RETRY_ACTION_FAIL}, max_restarts=1)
        moved = spec("long", "ml", gpus=1, checkpoint_interval=0.5,
                     command=(*RECORDER, "--duration", "8", "--checkpoint-every", "0.5"))
        moved.max_restarts = 0
        cuda = with_rules(spec("cuda", "ml", gpus=1, command=(sys.executable, "-c", CUDA_OOM)),
                          {"cause": OOM, "action": types_pb2.RETRY_ACTION_FAIL}, max_restarts=3)
        jobs = [fatal, flaky, moved, cuda]
        if CAN_OOM:
            cgroup.mkdir()
            (cgroup / "memory.limit_in_bytes").write_text(str(64 << 20))
            hog = f"echo $$ > {cgroup}/cgroup.procs && exec {sys.executable} -c 'b = bytearray(1 << 30)'"
            jobs.append(with_rules(spec("hog", "ml", gpus=1, command=("sh", "-c", hog)),
                                   {"cause": OOM, "action": types_pb2.RETRY_ACTION_FAIL}, max_restarts=3))
        ids = [(await client.submit(j)).job.job_id for j in jobs]
        done = {j.job_id: j for j in await client.wait_terminal({i for i in ids if i != ids[2]}, 90)}

        typo = done[ids[0]]
        assert typo.phase == FAILED and typo.attempt == 0 and typo.restarts == 0, typo
        assert [(f.cause, f.exit_code, f.counted) for f in typo.failures] == [(EXIT, 2, False)]
        assert "retry policy" in typo.reason
        assert attempts_recorded(tmp_path, ids[0]) == {0}            # ran once: no restart spent on it

        again = done[ids[1]]
        assert again.phase == FAILED and again.attempt == 1 and again.restarts == 1, again
        assert [(f.cause, f.exit_code, f.counted) for f in again.failures] == [(EXIT, 1, True), (EXIT, 1, True)]
        assert "restart budget spent" in again.reason
        assert attempts_recorded(tmp_path, ids[1]) == {0, 1}

        out_of_memory = done[ids[3]]   # PyTorch's CUDA OOM in its output: the cause is oom, the rule fails it
        assert out_of_memory.phase == FAILED and out_of_memory.attempt == 0, out_of_memory
        assert [(f.cause, f.exit_code, f.counted) for f in out_of_memory.failures] == [(OOM, 1, False)]
        assert "CUDA out of memory" in out_of_memory.failures[0].reason, out_of_memory.failures

        if CAN_OOM:
            hog = done[ids[4]]
            assert hog.phase == FAILED and hog.attempt == 0, hog
            assert [(f.cause, f.counted) for f in hog.failures] == [(OOM, False)], hog.failures

        # the long job loses its node: placed again on the other, though it has no restarts
        await until(client, lambda j: j.job_id == ids[2] and j.phase == RUNNING and j.checkpoint, 60)
        await agent(cluster, "node-1", tmp_path, gpus=1)
        await doomed.kill9()
        [long] = await client.wait_terminal({ids[2]}, 120)
        assert long.phase == SUCCEEDED and long.attempt >= 1 and long.restarts == 0, long
        assert long.failures and all(f.cause == NODE and not f.counted for f in long.failures), long.failures
        assert {w.node for w in long.workers} == {"node-1"}
        assert attempts_recorded(tmp_path, ids[2]) >= {0, 1}
        await client.close()
    finally:
        await cluster.stop_all()
        if cgroup.exists():
            cgroup.rmdir()


BAD_RULES = [({"cause": types_pb2.FAILURE_CAUSE_UNSPECIFIED}, "spec.retry[0].cause"),
             ({"cause": NODE, "exit_codes": [2]}, "spec.retry[0].exit_codes"),
             ({"cause": EXIT, "exit_codes": [0]}, "spec.retry[0].exit_codes"),
             ({"cause": EXIT, "action": types_pb2.RETRY_ACTION_IGNORE, "max_restarts": 2}, "spec.retry[0].max_restarts"),
             ({"cause": EXIT, "max_restarts": -1}, "spec.retry[0].max_restarts")]


async def test_a_bad_retry_rule_is_refused_naming_its_field(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs")
    try:
        admission = await cluster.admission()
        client = Client(f"127.0.0.1:{admission.port}")
        for rule, field in BAD_RULES:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await client.submit(with_rules(spec("bad", "ml", gpus=1), rule, max_restarts=1))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, rule
            assert field in err.value.details(), (rule, err.value.details())
        assert await client.list_all() == []    # nothing half-applied
        await client.close()
    finally:
        await cluster.stop_all()
