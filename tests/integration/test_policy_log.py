"""Cluster policy in the log, end to end on a real broker with real service processes:
quotas set through the operator API take effect in the placer and the preemptor at the
same log position, replicas agree, allow-lists are enforced at submit, and a placer
failover keeps fair share's queue order (the usage ledger is folded state)."""
from __future__ import annotations

import asyncio
import json
import sys
import uuid

import grpc
import pytest

from gpusched.adapters.log import codec
from gpusched.adapters.log.follower import LogFollower
from gpusched.adapters.log.publisher import DeadLetters, EventPublisher, partition_for
from gpusched.client import Client, spec
from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.core.reducer import apply
from gpusched.core.state import ClusterState
from gpusched.local_cluster import LocalCluster
from gpusched.policies.queueing.fairshare import QueueContext, fair_share
from gpusched.policies.queueing.usage import folded_decay
from gpusched.v1 import cluster_pb2
from tests.integration.logcheck import check_log, read_log
from tests.integration.cluster_calls import all_running

POOL_PARTITION = partition_for("default", 4)


def _positions(log, cls, pick=lambda e: True) -> list[tuple[int, ev.Event]]:
    """(offset, event) of the pool's partition, in log order, for events of ``cls``."""
    out = []
    for offset, value in log[POOL_PARTITION]:
        if value:
            event = codec.decode(value)[0]
            if isinstance(event, cls) and pick(event):
                out.append((offset, event))
    return out


async def _replica(bootstrap, topics) -> tuple[LogFollower, EventPublisher]:
    publisher = EventPublisher(bootstrap, topics, 4)
    await publisher.start()
    follower = LogFollower(bootstrap, topics, f"replica-{uuid.uuid4().hex[:6]}", DeadLetters(publisher, "t"))
    await follower.start()
    await follower.caught_up()
    return follower, publisher


async def test_a_quota_set_through_the_api_takes_effect_in_placer_and_preemptor_at_its_position(
        kafka_bootstrap, topics, tmp_path):
    bootstrap = tmp_path / "quotas.json"
    bootstrap.write_text(json.dumps({"orgs": {"": {"teams": {"team-a": {"limit_gpus": 2}}}}}))
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        admission = await cluster.admission("admission", 0, "--quotas", str(bootstrap))
        second = await cluster.admission("admission-2")
        await cluster.placer("placer")
        await cluster.preemptor("preemptor", "--min-runtime", "0", "--max-loss-per-wait", "inf", "--reclaim-min-runtime", "0")
        await cluster.agent("node-0", "8xH100-80GB", "--grace", "0.5")
        client, client2 = Client(f"127.0.0.1:{admission.port}"), Client(f"127.0.0.1:{second.port}")
        policy = await client.cluster.GetPolicy(cluster_pb2.GetPolicyRequest())
        assert [(q.team, q.limit_gpus) for q in policy.quotas if q.team == "team-a"] == [("team-a", 2.0)]

        # The placer: team-a's limit (2 GPUs, from the bootstrap file) keeps a-2 waiting
        # while 6 GPUs are free, until the operator raises it.
        a1 = (await client.submit(spec("a-1", "team-a", gpus=2, duration=600))).job.job_id
        a2 = (await client.submit(spec("a-2", "team-a", gpus=2, duration=600))).job.job_id
        await all_running(client, {a1})
        raised = await client.cluster.SetQuota(cluster_pb2.SetQuotaRequest(team="team-a", limit_gpus=4))
        assert [q.limit_gpus for q in raised.quotas if q.team == "team-a"] == [4.0]
        await all_running(client, {a2})

        # The preemptor: team-b borrows the rest; team-c has no guarantee, so its job waits
        # (same priority: nothing to preempt) until the operator gives it one.
        b = {(await client.submit(spec(f"b-{i}", "team-b", gpus=2, duration=600))).job.job_id for i in range(2)}
        await all_running(client, b)
        c1 = (await client.submit(spec("c-1", "team-c", gpus=2, duration=600))).job.job_id
        await client.cluster.SetQuota(cluster_pb2.SetQuotaRequest(team="team-c", guaranteed_gpus=2))
        await all_running(client, {c1})

        # Both admission replicas read the same policy back.
        views = [await c.cluster.GetPolicy(cluster_pb2.GetPolicyRequest()) for c in (client, client2)]
        assert views[0] == views[1]
        await client.close()
        await client2.close()
    finally:
        await cluster.stop_all()

    log = await read_log(kafka_bootstrap, topics)
    assert check_log(log).violations == []
    quota_at = {e.quota.team: o for o, e in _positions(log, ev.QuotaSet) if e.quota.team in ("team-a", "team-c")}
    raised_at = max(o for o, e in _positions(log, ev.QuotaSet, lambda e: e.quota.team == "team-a"))
    placed = dict((e.job_id, o) for o, e in _positions(log, ev.JobPlaced))
    assert placed[a1] < raised_at < placed[a2]       # a-2 waited for the QuotaSet, then went
    reclaims = _positions(log, ev.JobPreempted, lambda e: e.for_job == c1)
    assert reclaims and all(o > quota_at["team-c"] for o, _ in reclaims)
    assert all("reclaim" in e.reason for _, e in reclaims)

    # Two replicas folding the log agree by digest, policy included.
    r1, p1 = await _replica(kafka_bootstrap, topics)
    r2, p2 = await _replica(kafka_bootstrap, topics)
    try:
        assert {p: digest(s) for p, s in r1.states.items()} == {p: digest(s) for p, s in r2.states.items()}
        assert all(s.team_quotas["team-c"].guaranteed_milli == 2000 for s in r1.states.values())
    finally:
        for follower, publisher in ((r1, p1), (r2, p2)):
            await follower.stop()
            await publisher.stop()


async def _cli(*args: str) -> str:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "gpusched.cli", "policy", *args,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def test_allow_lists_refuse_a_class_or_pool_naming_the_field(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        admission = await cluster.admission()
        client = Client(f"127.0.0.1:{admission.port}")
        await cluster.agent("node-0", "8xH100-80GB")
        await client.cluster.SetTeamPolicy(cluster_pb2.SetTeamPolicyRequest(
            team="interns", weight=0.5, priority_classes=["best-effort"], pools=["default"]))
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await client.submit(spec("x", "interns", gpus=1, priority="production-inference"))
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert denied.value.details().startswith("spec.priority_class:")
        ok = await client.submit(spec("y", "interns", gpus=1, priority="best-effort"))
        assert ok.created
        # The default team's policy ('*') applies to teams without their own.
        await client.cluster.SetTeamPolicy(cluster_pb2.SetTeamPolicyRequest(team="*", pools=["other"]))
        with pytest.raises(grpc.aio.AioRpcError) as pool_denied:
            await client.submit(spec("z", "anyone", gpus=1))
        assert pool_denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert pool_denied.value.details().startswith("spec.pool:")
        # Bad policy values: INVALID_ARGUMENT naming the field, nothing written.
        for request, field in [
            (cluster_pb2.SetQuotaRequest(team="t", guaranteed_gpus=4, limit_gpus=2), "limit_gpus"),
            (cluster_pb2.SetQuotaRequest(team="t", guaranteed_gpus=-1), "guaranteed_gpus"),
            (cluster_pb2.SetQuotaRequest(team="t", guaranteed_gpus=1, lending_limit_gpus=2), "lending_limit_gpus"),
            (cluster_pb2.SetQuotaRequest(org="o", weight=0), "weight"),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await client.cluster.SetQuota(request)
            assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert bad.value.details().startswith(field), bad.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as bad_class:
            await client.cluster.SetTeamPolicy(cluster_pb2.SetTeamPolicyRequest(team="t", priority_classes=["gold"]))
        assert bad_class.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert bad_class.value.details().startswith("priority_classes")
        policy = await client.cluster.GetPolicy(cluster_pb2.GetPolicyRequest())
        assert not [q for q in policy.quotas if q.team == "t" or q.org == "o"]
        # The CLI sets and reads the same, and answers an error by its status.
        target = f"127.0.0.1:{admission.port}"
        out = await _cli("--target", target, "set-quota", "--org", "ml", "--team", "llm", "--guaranteed", "2",
                         "--limit", "4", "--no-borrowing")
        assert {"org": "ml", "team": "llm", "guaranteed_gpus": 2.0, "limit_gpus": 4.0, "borrowing": False,
                "lending_limit_gpus": -1.0, "weight": 1.0} in json.loads(out)["quotas"]   # every field, false too
        assert "llm" in [p["team"] for p in json.loads(await _cli("--target", target, "set-team", "llm",
                                                                  "--pool", "default"))["team_policies"]]
        with pytest.raises(AssertionError, match="INVALID_ARGUMENT: weight"):
            await _cli("--target", target, "set-team", "llm", "--weight", "0")
        await client.close()
    finally:
        await cluster.stop_all()


async def test_a_placer_failover_keeps_the_fair_share_order(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        admission = await cluster.admission()
        placer = await cluster.placer("placer", "--queue", "fair-share")
        await cluster.agent("node-0", "8xH100-80GB")
        client = Client(f"127.0.0.1:{admission.port}")
        # team-a used the whole node; team-b never ran anything.
        big = (await client.submit(spec("a-big", "team-a", gpus=8, duration=1.0))).job.job_id
        await client.wait_terminal({big}, timeout=60)
        await placer.kill9()
        # Submitted while no placer runs, a's first: by submission order a would go
        # first; by the usage a had (the folded ledger) b goes first.
        a_next = (await client.submit(spec("a-next", "team-a", gpus=8, duration=0.5))).job.job_id
        b_next = (await client.submit(spec("b-next", "team-b", gpus=8, duration=0.5))).job.job_id
        await cluster.placer("placer-2", "--queue", "fair-share")
        await client.wait_terminal({a_next, b_next}, timeout=120)
        await client.close()
    finally:
        await cluster.stop_all()
    log = await read_log(kafka_bootstrap, topics)
    placed = [e.job_id for _, e in _positions(log, ev.JobPlaced) if e.job_id in (a_next, b_next)]
    assert placed[:2] == [b_next, a_next]
    # The order the new placer followed is the one the log gives at the position where
    # both waited (right after b-next's submission), as any replica computes it.
    submitted_at = max(o for o, e in _positions(log, ev.JobSubmitted, lambda e: e.job_id == b_next))
    state = ClusterState()
    for offset, value in log[POOL_PARTITION]:
        if value and offset <= submitted_at:
            apply(state, codec.decode(value)[0])
    now = state.clock + 1.0
    order = fair_share(state, [state.jobs[j] for j in state.pending], now,
                       QueueContext(decayed=folded_decay(state, now)))
    assert [j.job_id for j in order] == [b_next, a_next]
