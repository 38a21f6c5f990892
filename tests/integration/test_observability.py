"""Traces and metrics of a running cluster, read back from a real Jaeger and Prometheus.

The services are real processes on the real broker; they export spans over OTLP to the
``jaeger`` fixture and serve /metrics, which the ``prometheus`` fixture scrapes. The
tests ask the back-ends' own HTTP APIs, as an operator's dashboards would.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.parse
import urllib.request

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from gpusched.client import Client, spec
from gpusched.ctl.decode import DESCRIPTOR_SET
from gpusched.local_cluster import LocalCluster
from gpusched.v1 import events_pb2, types_pb2
from tests.integration.logcheck import read_log
from tests.integration.cluster_calls import until
from tests.polling import eventually_async

SUCCEEDED = types_pb2.JOB_PHASE_SUCCEEDED
PENDING = types_pb2.JOB_PHASE_PENDING
RUNNING = types_pb2.JOB_PHASE_RUNNING


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.loads(answer.read())


async def eventually(probe, what: str, timeout: float = 60.0, done=bool):
    """``probe()``'s first answer that is ``done``: the back-ends take exports and scrapes
    in the background, on their own schedule, so the test asks again until they have."""
    last = None

    async def answered() -> bool:
        nonlocal last
        last = await asyncio.to_thread(probe)
        return done(last)
    try:
        await eventually_async(answered, what, timeout, poll=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc} (last answer: {last!r})") from None
    return last


# --- traces -----------------------------------------------------------------------------
EXPECTED = {("gpusched-admission", "SubmitJob"), ("gpusched-placer", "place"),
            ("gpusched-node-agent", "worker start"), ("gpusched-node-agent", "worker end")}


def job_trace(jaeger, job_id: str) -> dict | None:
    """The trace whose SubmitJob span is this job's, once it holds every span expected."""
    query = urllib.parse.urlencode({"service": "gpusched-admission", "operation": "SubmitJob",
                                    "tags": json.dumps({"gpusched.job_id": job_id}), "limit": 5})
    found = get_json(f"{jaeger.url}/api/traces?{query}")["data"]
    if len(found) != 1:
        return None
    data = found[0]
    services = {pid: p["serviceName"] for pid, p in data["processes"].items()}
    have = {(services[s["processID"]], s["operationName"]) for s in data["spans"]}
    return data if EXPECTED <= have else None


async def test_a_job_is_one_trace_across_admission_placer_and_node_agent(
        kafka_bootstrap, topics, tmp_path, jaeger, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", jaeger.otlp_endpoint)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")   # export within 0.1 s, not 5 s
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await cluster.agent("node-0")
        client = Client(f"127.0.0.1:{admission.port}")
        job_id = (await client.submit(spec("traced", "nlp", gpus=1, duration=0.2))).job.job_id
        [job] = await client.wait_terminal({job_id})
        assert job.phase == SUCCEEDED
        await client.close()
        data = await eventually(lambda: job_trace(jaeger, job_id), f"the trace of {job_id}")
    finally:
        await cluster.stop_all()

    services = {pid: p["serviceName"] for pid, p in data["processes"].items()}
    spans = data["spans"]
    assert {s["traceID"] for s in spans} == {data["traceID"]}
    [submit] = [s for s in spans if s["operationName"] == "SubmitJob"]
    by_id = {s["spanID"]: s for s in spans}

    def parent(span) -> dict | None:
        refs = [r for r in span["references"] if r["refType"] == "CHILD_OF"]
        return by_id.get(refs[0]["spanID"]) if refs else None

    # the placer's decision, the worker's start and end: children of SubmitJob
    for name in ("place", "worker start", "worker end"):
        [span] = [s for s in spans if s["operationName"] == name]
        assert parent(span) is submit, name
        assert {"key": "gpusched.job_id", "type": "string", "value": job_id} in span["tags"]
    # the decision also links to the batched scheduling cycle, a trace of its own
    [place] = [s for s in spans if s["operationName"] == "place"]
    assert [r["refType"] for r in place["references"]] == ["CHILD_OF", "FOLLOWS_FROM"]
    assert place["references"][1]["traceID"] != data["traceID"]
    # each service consumed the job's events in this trace, as Kafka consumer spans: admission
    # and the placer fold the pool log; the node-agent reads its node's work view, whose
    # records name the pool-log event they reflect and carry its publisher's context
    work = f"{topics.prefix}work.node-0"
    consumed = [s for s in spans if s["operationName"] in (f"process {topics.events}", f"process {work}")]
    by_topic = {}
    for span in consumed:
        tags = {t["key"]: t["value"] for t in span["tags"]}
        by_topic.setdefault(tags["messaging.destination.name"], set()).add(services[span["processID"]])
        assert tags["messaging.system"] == "kafka" and f"process {tags['messaging.destination.name']}" == \
            span["operationName"]
        assert tags["span.kind"] == "consumer" and tags["gpusched.job_id"] == job_id
        assert parent(span) is not None   # parented by the span that published the event
    assert by_topic[topics.events] >= {"gpusched-admission", "gpusched-placer"}
    assert by_topic[work] == {"gpusched-node-agent"}
    assert "gpusched-node-agent" not in by_topic[topics.events]   # it reads only its view
    events = {(services[s["processID"]], dict((t["key"], t["value"]) for t in s["tags"])["gpusched.event"])
              for s in consumed}
    assert ("gpusched-node-agent", "JobPlaced") in events
    assert ("gpusched-admission", "WorkerFinished") in events


def spans_of(jaeger, job_id: str, done) -> dict | None:
    """The job's trace once ``done(trace)``."""
    query = urllib.parse.urlencode({"service": "gpusched-admission", "operation": "SubmitJob",
                                    "tags": json.dumps({"gpusched.job_id": job_id}), "limit": 5})
    found = get_json(f"{jaeger.url}/api/traces?{query}")["data"]
    return found[0] if len(found) == 1 and done(found[0]) else None


def events_in(data: dict) -> list[tuple[str, str]]:
    """(service, event type) of each consumer span of the trace."""
    services = {pid: p["serviceName"] for pid, p in data["processes"].items()}
    return [(services[s["processID"]], tag["value"]) for s in data["spans"]
            for tag in s["tags"] if tag["key"] == "gpusched.event"]


async def test_a_preemption_and_the_requeued_attempt_stay_in_the_victims_trace(
        kafka_bootstrap, topics, tmp_path, jaeger, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", jaeger.otlp_endpoint)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await cluster.preemptor("preemptor", "--min-runtime", "0", "--max-loss-per-wait", "inf")
        await cluster.agent("node-0", "8xH100-80GB", "--grace", "1")
        client = Client(f"127.0.0.1:{admission.port}")
        victim = (await client.submit(spec("victim", "research", gpus=8, duration=1.0,
                                           priority="best-effort"))).job.job_id
        await until(client, lambda j: j.job_id == victim and j.phase == RUNNING)
        urgent = (await client.submit(spec("urgent", "prod", gpus=8, duration=0.2,
                                           priority="training-high"))).job.job_id
        jobs = {j.job_id: j for j in await client.wait_terminal({victim, urgent}, timeout=180)}
        assert jobs[victim].preemptions >= 1 and jobs[victim].phase == SUCCEEDED
        await client.close()

        def complete(data) -> bool:
            names = [s["operationName"] for s in data["spans"]]
            return (names.count("place") >= 2 and names.count("worker end") >= 2 and "preempt" in names
                    and ("gpusched-preemptor", "JobPreempted") in events_in(data))
        data = await eventually(lambda: spans_of(jaeger, victim, complete), f"the preemption in {victim}'s trace")
    finally:
        await cluster.stop_all()
    events = events_in(data)
    # every service folded the preemption, in the victim's one trace
    assert {svc for svc, event in events if event == "JobPreempted"} >= {
        "gpusched-admission", "gpusched-placer", "gpusched-preemptor", "gpusched-node-agent"}
    attempts = sorted(tag["value"] for s in data["spans"] if s["operationName"] == "place"
                      for tag in s["tags"] if tag["key"] == "gpusched.attempt")
    assert attempts[0] == 0 and attempts[-1] >= 1   # placed again after the requeue
    assert {s["traceID"] for s in data["spans"]} == {data["traceID"]}
    # the preemptor's decision: a span of the victim's trace, a child of its SubmitJob,
    # linked to the urgent job's trace; every service's JobPreempted span is its child
    services = {pid: p["serviceName"] for pid, p in data["processes"].items()}
    by_id = {s["spanID"]: s for s in data["spans"]}
    preempts = {s["spanID"]: s for s in data["spans"] if s["operationName"] == "preempt"}
    for preempt in preempts.values():
        tags = {t["key"]: t["value"] for t in preempt["tags"]}
        assert services[preempt["processID"]] == "gpusched-preemptor"
        assert tags["gpusched.job_id"] == victim and tags["gpusched.for_job"] == urgent
        assert tags["gpusched.cause"] == "priority"
        refs = {r["refType"]: r for r in preempt["references"]}
        assert by_id[refs["CHILD_OF"]["spanID"]]["operationName"] == "SubmitJob"
        assert refs["FOLLOWS_FROM"]["traceID"] != data["traceID"]   # the urgent job's trace
    preempted = [s for s in data["spans"] if {"key": "gpusched.event", "type": "string",
                                               "value": "JobPreempted"} in s["tags"]]
    assert preempted and all(s["references"][0]["spanID"] in preempts for s in preempted)


def trace_services(data: dict) -> set[str]:
    return {p["serviceName"] for p in data["processes"].values()}


async def test_each_job_of_a_batch_is_a_trace_and_a_callers_span_is_its_jobs_parent(
        kafka_bootstrap, topics, tmp_path, jaeger, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", jaeger.otlp_endpoint)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    # The caller: a program of its own that traces with OpenTelemetry (a provider of this
    # test's own, not the process-wide one) and submits through the Python client.
    caller = TracerProvider(resource=Resource.create({"service.name": "training-platform"}))
    caller.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=jaeger.otlp_endpoint)))
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await cluster.agent("node-0")
        client = Client(f"127.0.0.1:{admission.port}")
        with caller.get_tracer("test").start_as_current_span("launch experiment") as launch:
            alone = (await client.submit(spec("alone", "nlp", gpus=1, duration=0.2))).job.job_id
            batch = [r.job.job_id for r in await client.submit_many(
                [(spec(f"batch-{i}", "nlp", gpus=1, duration=0.2), "") for i in range(3)])]
        assert {j.phase for j in await client.wait_terminal({alone, *batch})} == {SUCCEEDED}
        await client.close()
        traces = {job_id: await eventually(lambda j=job_id: job_trace(jaeger, j), f"the trace of {job_id}")
                  for job_id in (alone, *batch)}
    finally:
        await cluster.stop_all()
        caller.shutdown()
    launched = f"{launch.get_span_context().trace_id:032x}"
    # the job submitted alone: in the caller's trace, its SubmitJob a child of the caller's span
    assert traces[alone]["traceID"] == launched
    [submit] = [s for s in traces[alone]["spans"] if s["operationName"] == "SubmitJob"
                and {"key": "gpusched.job_id", "type": "string", "value": alone} in s["tags"]]
    assert submit["references"][0]["refType"] == "CHILD_OF"
    assert submit["references"][0]["spanID"] == f"{launch.get_span_context().span_id:016x}"
    # each job of the batch: a trace of its own across the services, linked to the batch's span
    assert len({traces[job_id]["traceID"] for job_id in batch} | {launched}) == 4
    for job_id in batch:
        data = traces[job_id]
        assert trace_services(data) >= {"gpusched-admission", "gpusched-placer", "gpusched-node-agent"}
        [root] = [s for s in data["spans"] if s["operationName"] == "SubmitJob"]
        assert [(r["refType"], r["traceID"]) for r in root["references"]] == [("FOLLOWS_FROM", launched)]
        placed = [s for s in data["spans"] if s["operationName"] == "place"]
        assert placed and all({"key": "gpusched.job_id", "type": "string", "value": job_id} in s["tags"]
                              for s in placed)


def headers_of(record) -> dict[str, str]:
    return {name: value.decode() for name, value in record.headers}


async def test_records_carry_their_schema_type_and_trace_and_decode_outside_gpusched(
        kafka_bootstrap, topics, tmp_path, jaeger, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", jaeger.otlp_endpoint)
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        admission = await cluster.admission()   # with the relay, which forwards the agents' reports
        await cluster.placer()
        await cluster.agent("node-0")
        client = Client(f"127.0.0.1:{admission.port}")
        job_id = (await client.submit(spec("read-by-others", "nlp", gpus=1, duration=0.2))).job.job_id
        [job] = await client.wait_terminal({job_id})
        assert job.phase == SUCCEEDED
        await client.close()
    finally:
        await cluster.stop_all()
    records = [r for part in (await read_log(kafka_bootstrap, topics, whole=True)).values() for r in part]
    envelopes = [events_pb2.EventEnvelope.FromString(r.value) for r in records]
    for record, envelope in zip(records, envelopes):
        headers = headers_of(record)
        assert headers["gpusched.schema"] == "gpusched.v1.EventEnvelope"
        assert headers["gpusched.event-type"] == envelope.type
        assert headers.get("traceparent") == envelope.trace_context.get("traceparent")
    about_job = {e.type: headers_of(r) for r, e in zip(records, envelopes)
                 if e.WhichOneof("payload") and getattr(getattr(e, e.WhichOneof("payload")), "job_id", "") == job_id}
    # the job's events, those the agent reported through the relay too, carry its trace
    assert {"JobSubmitted", "JobPlaced", "WorkerStarted", "WorkerFinished"} <= set(about_job)
    trace_id = about_job["JobSubmitted"]["traceparent"].split("-")[1]
    assert {h["traceparent"].split("-")[1] for h in about_job.values()} == {trace_id}
    beats = [r for part in (await read_log(kafka_bootstrap, topics, f"{topics.prefix}beats.node-0",
                                           whole=True)).values() for r in part]
    assert beats and all(headers_of(r)["gpusched.schema"] == "gpusched.v1.Heartbeat" for r in beats)

    # `gpusched decode` on the records as kcat -f '%S\n%s' writes them: one JSON object each
    stream = b"".join(f"{len(r.value)}\n".encode() + r.value for r in records)
    decoded = subprocess.run([sys.executable, "-m", "gpusched.cli", "decode"], input=stream,
                             capture_output=True, check=True).stdout.decode().splitlines()
    objects = [json.loads(line) for line in decoded]
    assert [(o["event_id"], o["type"]) for o in objects] == [(e.event_id, e.type) for e in envelopes]
    [submitted] = [o for o in objects if o["type"] == "JobSubmitted"]
    assert submitted["job_submitted"]["job_id"] == job_id and submitted["job_submitted"]["spec"]["team"] == "nlp"
    # protoc with the descriptor set alone (no .proto files, no gpusched code)
    placed = next(r for r, e in zip(records, envelopes) if e.type == "JobPlaced")
    text = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "--decode=gpusched.v1.EventEnvelope",
                           f"--descriptor_set_in={DESCRIPTOR_SET}", "gpusched/v1/events.proto"],
                          input=placed.value, capture_output=True, check=True, cwd=tmp_path).stdout.decode()
    assert 'type: "JobPlaced"' in text and f'job_id: "{job_id}"' in text


# --- metrics ----------------------------------------------------------------------------
def promql(prometheus, query: str) -> list[dict]:
    url = f"{prometheus.url}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    answer = get_json(url)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def value(prometheus, query: str) -> float | None:
    result = promql(prometheus, query)
    return float(result[0]["value"][1]) if len(result) == 1 else None


async def test_prometheus_scrapes_decisions_pending_jobs_allocation_and_rpcs(
        kafka_bootstrap, topics, tmp_path, prometheus):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path, metrics=True)
    try:
        services = [await cluster.admission(), await cluster.placer(), await cluster.agent("node-0")]
        prometheus.targets_file.write_text(json.dumps([{
            "targets": [f"127.0.0.1:{s.metrics_port}" for s in services],
            "labels": {"cluster": topics.prefix}}]))
        admission, placer = (f'cluster="{topics.prefix}",instance="127.0.0.1:{s.metrics_port}"'
                             for s in services[:2])
        client = Client(f"127.0.0.1:{services[0].port}")
        running = (await client.submit(spec("all-gpus", "nlp", gpus=8, duration=600))).job.job_id
        waiting = (await client.submit(spec("waits", "vision", gpus=8, duration=1))).job.job_id
        assert (await client.get(waiting)).phase == PENDING
        expected = {
            f'gpusched_jobs_pending{{{admission},team="vision",pool="default"}}': 1,
            f'gpusched_jobs_pending{{{admission},team="nlp"}}': None,   # placed: no longer waiting
            f'gpusched_gpus_requested{{{placer},team="vision",pool="default"}}': 8,
            f'gpusched_gpus_allocated{{{admission},pool="default",state="allocated"}}': 8,
            f'gpusched_gpus_allocated{{{admission},pool="default",state="total"}}': 8,
            f'gpusched_placer_decisions_total{{{placer},pool="default"}}': 1,
            f'gpusched_rpc_server_duration_seconds_count{{{admission},'
            'method="/gpusched.v1.AdmissionService/SubmitJob",code="OK"}': 2,
        }

        def scraped() -> dict:
            return {query: value(prometheus, query) for query in expected}

        # Each target is scraped on its own schedule: ask until every answer is in.
        await eventually(scraped, "the expected metrics", timeout=30, done=lambda now: now == expected)
        assert (await client.get(running)).phase != PENDING
        assert value(prometheus, f'sum(gpusched_placer_cycle_duration_seconds_count{{{placer}}})') >= 1
        lags = promql(prometheus, f'gpusched_consumer_lag{{{admission}}}')
        assert lags and all(float(r["value"][1]) >= 0 for r in lags)
        await client.close()
    finally:
        await cluster.stop_all()
