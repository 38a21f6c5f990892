"""The admission API: idempotent submission, clear errors for bad input, and a log
that survives garbage: malformed records go to the dead-letter topic, consumers go on."""
from __future__ import annotations

import asyncio

import grpc
import pytest
from aiokafka import AIOKafkaProducer

from gpusched.adapters.log.publisher import partition_for
from gpusched.adapters.broker.kafka_security import client_args
from gpusched.client import Client, duration_of, seconds, spec
from gpusched.v1 import admission_pb2, cluster_pb2, events_pb2, types_pb2
from tests.integration.logcheck import read_log
from tests.integration.cluster_calls import SUCCEEDED
from tests.polling import eventually_async


async def test_same_idempotency_key_gives_one_job_even_concurrently_and_across_replicas(api):
    cluster, client = api
    other = await cluster.admission("admission-2")
    client2 = Client(f"127.0.0.1:{other.port}")
    job_spec = spec("once", "nlp", gpus=1, duration=0.2)
    calls = [c.submit(job_spec, key="run-42") for c in (client, client2) for _ in range(10)]
    responses = await asyncio.gather(*calls)
    assert len({r.job.job_id for r in responses}) == 1
    assert sum(r.created for r in responses) == 1
    listed = await client.list_all(team="nlp")
    assert [j.job_id for j in listed] == [responses[0].job.job_id]
    # The same key in another team is another job.
    other_team = await client.submit(spec("once", "vision", gpus=1, duration=0.2), key="run-42")
    assert other_team.created and other_team.job.job_id != responses[0].job.job_id
    await client2.close()


def _bad(**changes) -> types_pb2.JobSpec:
    s = spec("ok", "team-a", gpus=1, duration=0.1)
    for path, value in changes.items():
        target, *rest = path.split("__")
        if rest:
            field = getattr(s, target)
            if isinstance(value, list):
                del field.__getattribute__(rest[0])[:]
                getattr(field, rest[0]).extend(value)
            else:
                setattr(field, rest[0], value)
        else:
            setattr(s, target, value)
    return s


INVALID = [
    (_bad(resources__gpus=0), "spec.resources.gpus"),
    (_bad(resources__gpus=-2), "spec.resources.gpus"),
    (_bad(resources__gpus=0, resources__gpu_milli=1500), "spec.resources.gpu_milli"),
    (_bad(resources__gpus=2, resources__gpu_milli=300), "spec.resources"),
    (_bad(resources__gpus=0, resources__mig_profile="5g"), "spec.resources.mig_profile"),
    (_bad(resources__gpu_models=["H10O"]), "spec.resources.gpu_models[0]"),
    (_bad(resources__gpu_models=["T4"]), "spec.resources.gpu_models"),     # not in this pool
    (_bad(resources__gpus=9), "spec.resources.gpus"),                       # nodes have 8
    (_bad(resources__gpus=8, workers=3), "spec.workers"),                   # pool has 8
    (_bad(team=""), "spec.team"),
    (_bad(name=""), "spec.name"),
    (_bad(priority_class="urgent"), "spec.priority_class"),
    (_bad(resources__cpu_milli=-1), "spec.resources.cpu_milli"),
]


@pytest.mark.parametrize("bad_spec,field", INVALID, ids=[f for _, f in INVALID])
async def test_invalid_requests_get_invalid_argument_naming_the_field(api, bad_spec, field):
    _, client = api
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.submit(bad_spec)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(field + ":") or f"; {field}:" in err.value.details(), err.value.details()


async def test_a_node_registering_later_widens_what_admission_accepts(api):
    """Admission validates against a summary of the pool that it keeps between
    submissions: a node joining must renew it."""
    cluster, client = api
    big = spec("big", "team-a", gpus=16, duration=0.1)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.submit(big)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("spec.resources.gpus: 16 per worker exceeds the largest node")
    await cluster.agent("node-16", "16xA100-80GB")
    async def registered() -> bool:   # once admission's read model has folded the registration
        try:
            await client.cluster.GetNode(cluster_pb2.GetNodeRequest(name="node-16"))
            return True
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.NOT_FOUND, exc
            return False
    await eventually_async(registered, "node-16 registered", 60, poll=0.05)
    assert (await client.submit(big)).created


async def test_other_bad_requests_name_their_field(api):
    _, client = api
    cases = [
        (client.jobs.GetJob(admission_pb2.GetJobRequest()), grpc.StatusCode.INVALID_ARGUMENT, "job_id"),
        (client.jobs.ListJobs(admission_pb2.ListJobsRequest(page_size=5000)), grpc.StatusCode.INVALID_ARGUMENT, "page_size"),
        (client.jobs.ListJobs(admission_pb2.ListJobsRequest(page_token="%%%")), grpc.StatusCode.INVALID_ARGUMENT, "page_token"),
        (client.jobs.CancelJob(admission_pb2.CancelJobRequest(job_id="nope")), grpc.StatusCode.NOT_FOUND, "job_id"),
    ]
    for call, code, field in cases:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        assert err.value.code() == code and err.value.details().startswith(field), err.value.details()


async def test_submit_jobs_in_one_call_keeps_order_and_idempotency(api, kafka_bootstrap, topics):
    _, client = api
    held = await client.submit(spec("held", "nlp", gpus=1, duration=0.1), key="k-held")
    items = [(spec(f"batch-{i}", "nlp", gpu_milli=250, duration=0.1), "") for i in range(40)]
    items[5] = (spec("twice", "nlp", gpus=1, duration=0.1), "k-twice")
    items[6] = (spec("twice", "nlp", gpus=1, duration=0.1), "k-twice")     # the same key again, same call
    items[7] = (spec("held", "nlp", gpus=1, duration=0.1), "k-held")       # a key already used
    results = await client.submit_many(items)
    assert [r.job.spec.name for r in results] == [s.name for s, _ in items]
    assert results[5].job.job_id == results[6].job.job_id and [results[5].created, results[6].created] == [True, False]
    assert results[7].job.job_id == held.job.job_id and not results[7].created
    assert all(r.created for i, r in enumerate(results) if i not in (6, 7))
    distinct = {r.job.job_id for r in results}
    assert len(distinct) == 39
    done = await client.wait_terminal(distinct, timeout=120)
    assert len(done) == 39 and {j.phase for j in done} == {SUCCEEDED}
    # one JobSubmitted per job in the log: the repeated key wrote a second event, which
    # the reducer rejected (a duplicate job id), or none at all
    events = [e for records in (await read_log(kafka_bootstrap, topics)).values() for _, v in records
              if (e := events_pb2.EventEnvelope.FromString(v)).type == "JobSubmitted"]
    ids = [e.job_submitted.job_id for e in events]
    assert set(ids) == distinct | {held.job.job_id} and ids.count(held.job.job_id) == 1


async def test_submit_jobs_with_an_invalid_item_writes_nothing_and_names_the_item(api):
    _, client = api
    good = spec("fine", "nlp", gpus=1, duration=0.1)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.submit_many([(good, ""), (_bad(team=""), ""), (good, ""), (_bad(resources__gpus=9), "")])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = err.value.details()
    assert details.startswith("jobs[1].spec.team:") and "; jobs[3].spec.resources.gpus:" in details, details
    assert await client.list_all() == []
    for items, message in [([], "jobs: must not be empty"), ([(good, "")] * 1001, "jobs: at most 1000 per request")]:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.submit_many(items)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and err.value.details() == message
    assert await client.list_all() == []


async def test_garbage_and_unknown_events_go_to_dead_letters_and_consumers_keep_running(api, kafka_bootstrap, topics):
    cluster, client = api
    partition = partition_for("default", 4)
    producer = AIOKafkaProducer(**client_args(kafka_bootstrap))
    await producer.start()
    bogus = events_pb2.EventEnvelope(event_id="x1", type="JobTeleported", pool="default").SerializeToString()
    mismatched = events_pb2.EventEnvelope(event_id="x2", type="JobCancelled", pool="default",
                                          job_placed=events_pb2.JobPlaced(job_id="j")).SerializeToString()
    for value in (b"\xff\x00garbage", bogus, mismatched, b""):
        await producer.send_and_wait(topics.events, value, key=b"default", partition=partition)
    await producer.stop()

    # Every consumer is still alive and acting on new events after the garbage.
    job = (await client.submit(spec("after-garbage", "team-a", gpus=2, duration=0.2))).job
    (done,) = await client.wait_terminal({job.job_id})
    assert done.phase == SUCCEEDED
    assert all(s.alive for s in cluster.services)

    letters = [events_pb2.DeadLetter.FromString(v) for vs in (await read_log(kafka_bootstrap, topics, topics.dead_letters)).values() for _, v in vs]
    reasons = {(l.offset, l.reason) for l in letters}
    assert {l.consumer.split("-")[0] for l in letters} == {"placer"}   # one writer: one letter per record
    assert len(letters) == 4
    assert any("unknown event type 'JobTeleported'" in r for _, r in reasons)
    assert any("does not match payload" in r for _, r in reasons)
    assert any("not an EventEnvelope" in r or "empty record" in r for _, r in reasons)
    assert len({o for o, _ in reasons}) == 4


@pytest.mark.parametrize("default_limit, max_limit, field", [
    ({"seconds": -1}, {}, "default_time_limit: must not be negative"),
    ({}, {"seconds": 1, "nanos": 1_500_000_000}, "max_time_limit: not a valid google.protobuf.Duration"),
    ({"seconds": 7200}, {"seconds": 3600}, "default_time_limit: 7200s is above max_time_limit 3600s"),
])
async def test_bad_pool_time_limits_are_invalid_argument_naming_the_field(api, default_limit, max_limit, field):
    _, client = api
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.cluster.SetPoolTimeLimits(cluster_pb2.SetPoolTimeLimitsRequest(
            pool="default", default_time_limit=default_limit, max_time_limit=max_limit))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and err.value.details().startswith(field)
    assert seconds((await client.summary()).max_time_limit) == 0.0


async def test_pool_time_limits_give_jobs_a_default_and_refuse_more_than_the_maximum(api):
    """Slurm's partition DefaultTime/MaxTime, set in the log through the operator API."""
    _, client = api
    summary = await client.cluster.SetPoolTimeLimits(cluster_pb2.SetPoolTimeLimitsRequest(
        pool="default", default_time_limit=duration_of(600), max_time_limit=duration_of(3600)))
    assert (seconds(summary.default_time_limit), seconds(summary.max_time_limit)) == (600, 3600)
    plain = (await client.submit(spec("plain", "nlp", gpus=1, duration=0.1))).job
    assert seconds(plain.time_limit) == 600
    asks = (await client.submit(spec("asks", "nlp", gpus=1, duration=0.1, max_runtime=1800))).job
    assert seconds(asks.time_limit) == 1800
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.submit(spec("greedy", "nlp", gpus=1, duration=0.1, max_runtime=7200))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("spec.max_runtime:") and "3600" in err.value.details()
    assert [j.spec.name for j in await client.list_all(team="nlp")] == ["plain", "asks"]


async def test_pool_topology_levels_are_checked_shown_and_honoured_at_submission(api):
    """SetPoolTopology: bad levels are INVALID_ARGUMENT naming the level; the summary shows
    the levels (the default ones until declared); a submission naming a level its pool
    lacks is INVALID_ARGUMENT naming the field, and one it has is taken as asked."""
    _, client = api
    assert list((await client.summary()).topology_levels) == ["spine", "rack"]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.set_pool_topology("default", ["rack", "not a label"])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and err.value.details().startswith("levels[1]:")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.set_pool_topology("", ["rack"])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and err.value.details().startswith("pool:")
    assert list((await client.summary()).topology_levels) == ["spine", "rack"]   # nothing written

    gang = spec("gang", "nlp", gpus=1, workers=2, duration=0.1)
    gang.topology.required = "block"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.submit(gang)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("spec.topology.required:") and "'block'" in err.value.details()
    uneven = spec("uneven", "nlp", gpus=1, workers=2, duration=0.1)
    uneven.topology.slice.level, uneven.topology.slice.workers = "rack", 3
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.submit(uneven)
    assert err.value.details().startswith("spec.topology.slice.workers:")

    summary = await client.set_pool_topology("default", ["spine", "rack", "block"])
    assert list(summary.topology_levels) == ["spine", "rack", "block"]
    assert list((await client.summary()).topology_levels) == ["spine", "rack", "block"]
    gang.topology.slice.level, gang.topology.slice.workers = "block", 1
    job = (await client.submit(gang)).job
    assert job.spec.topology == gang.topology
    assert (await client.get(job.job_id)).spec.topology.required == "block"
    assert list((await client.set_pool_topology("default", [])).topology_levels) == ["spine", "rack"]
