"""The dashboard's HTML from hand-built API messages: everything user-given is escaped."""
from __future__ import annotations

from html.parser import HTMLParser

from gpusched.dashboard import pages
from gpusched.dashboard.model import Sample, Step
from gpusched.v1 import types_pb2

EVIL = "<script>alert(1)</script>\"'&"


class Tags(HTMLParser):
    def __init__(self, html: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def evil_job(phase=types_pb2.JOB_PHASE_PENDING) -> types_pb2.Job:
    return types_pb2.Job(job_id=EVIL, phase=phase, reason=EVIL, submitted_at={"seconds": 1},
                         spec=types_pb2.JobSpec(name=EVIL, team=EVIL, pool=EVIL, priority_class=EVIL, workers=1,
                                                resources=types_pb2.WorkerResources(mig_profile=EVIL)),
                         workers=[types_pb2.WorkerAssignment(node=EVIL, gpus=[types_pb2.GpuSlot(index=0)])])


def evil_node() -> types_pb2.Node:
    return types_pb2.Node(info=types_pb2.NodeInfo(name=EVIL, pool=EVIL),
                          status=types_pb2.NODE_STATUS_READY,
                          gpus=[types_pb2.Gpu(info=types_pb2.GpuInfo(index=0, model=EVIL), healthy=True,
                                              used_milli=1000, allocated_milli=1000)])


def test_overview_escapes_names_teams_pools_and_reasons():
    html = pages.overview({EVIL: [Sample(1, 0.5, 0.25)]}, [evil_node()],
                          [evil_job(), evil_job(types_pb2.JOB_PHASE_RUNNING)], EVIL, 10)
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    tags = Tags(html).tags
    assert [t for t, _ in tags].count("script") == 0
    links = [a["href"] for t, a in tags if t == "a"]
    assert links == ["/job/%3Cscript%3Ealert%281%29%3C%2Fscript%3E%22%27%26"]
    cell = next(a for t, a in tags if t == "div" and "gpu" in a.get("class", "").split())
    assert cell["title"].endswith(f"({EVIL}, {EVIL})") and cell["data-state"] == "whole"   # attribute intact, escaped
    assert next(a for t, a in tags if a.get("data-node"))["data-node"] == EVIL


def test_job_page_escapes_and_lists_its_timeline():
    html = pages.job_page(evil_job(), [Step(1.0, "Submitted"), Step(2.0, EVIL, EVIL)], now=5.0)
    assert "<script>" not in html
    tags = Tags(html).tags
    assert [a["data-step"] for t, a in tags if t == "li" and "data-step" in a] == ["Submitted", EVIL]
    assert ("title", {}) in tags and html.count("&lt;script&gt;") >= 5


def test_chart_draws_both_series_across_the_sampled_time():
    svg = pages.chart([Sample(0, 0.0, 1.0), Sample(5, 1.0, 0.0), Sample(10, 0.5, 0.5)], width=100, height=12)
    polylines = {a["class"]: a["points"].split() for t, a in Tags(svg).tags if t == "polyline"}
    assert polylines["allocation"] == ["0.0,11.0", "50.0,1.0", "100.0,6.0"]
    assert polylines["fragmentation"] == ["0.0,1.0", "50.0,11.0", "100.0,6.0"]
    assert "no samples yet" in pages.chart([])


def test_queue_lists_pending_jobs_oldest_first_and_counts_the_rest():
    def job(i: int, phase: int, t: int) -> types_pb2.Job:
        return types_pb2.Job(job_id=f"job-{i}", phase=phase, submitted_at={"seconds": t}, reason=f"r{i}",
                             spec=types_pb2.JobSpec(name=f"j{i}", team="nlp", pool="p", workers=1,
                                                    resources=types_pb2.WorkerResources(gpus=1)))
    pending = types_pb2.JOB_PHASE_PENDING
    html = pages.queues([job(1, pending, 5), job(2, types_pb2.JOB_PHASE_RUNNING, 1), job(3, pending, 2)], now=10)
    rows = [a["data-job"] for t, a in Tags(html).tags if t == "tr" and "data-job" in a]
    assert rows == ["job-3", "job-1"] and "1 running, 2 pending" in html and "<td>8s</td>" in html


def test_pool_figures_are_the_nodes_now_and_the_chart_the_samples():
    node = evil_node()   # its one GPU in use
    html = pages.pools_section({EVIL: [Sample(1, 0.0, 0.0), Sample(2, 0.0, 0.0)], "gone": [Sample(1, 0.5, 0.5)]},
                               [node])
    assert '<td class="allocation">100%</td>' in html and '<td class="fragmentation">0%</td>' in html
    assert [a["data-samples"] for t, a in Tags(html).tags if t == "svg"] == ["2", "1"]   # sorted by pool
    assert '<tr data-pool="gone"><th>gone</th><td>0</td><td class="allocation">0%</td>' in html


def test_queues_and_job_page_show_why_a_job_is_pending():
    waiting = types_pb2.Job(job_id="j1", phase=types_pb2.JOB_PHASE_PENDING, submitted_at={"seconds": 1},
                            spec=types_pb2.JobSpec(name="n", team="t", pool="p", workers=1),
                            pending=types_pb2.PendingReason(kind=types_pb2.PENDING_KIND_NO_FIT, summary=EVIL))
    queue, page = pages.queues([waiting], now=2.0), pages.job_page(waiting, [], now=2.0)
    for html in (queue, page):
        assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert '<td class="why">&lt;script&gt;' in queue and '<td class="why pending">&lt;script&gt;' in page
    assert pages.why_pending(types_pb2.Job(phase=types_pb2.JOB_PHASE_RUNNING, pending=waiting.pending)) == ""


def a_service(name: str = "web", done: bool = True) -> types_pb2.Service:
    msg = types_pb2.Service(desired=3, revision=2, replicas=2, updated=2, ready=1, rollout_done=done,
                            rollout="complete" if done else "rolling out revision 2: 2 of 3 updated, 1 ready",
                            spec=types_pb2.ServiceSpec(name=name, team="ml", pool="default"))
    msg.replica.add(job_id=f"{name}-0", revision=2, phase=types_pb2.JOB_PHASE_RUNNING, ready=True,
                    endpoint="10.0.0.5:31000", nodes=["node-0"])
    msg.replica.add(job_id=f"{name}-1", revision=2, phase=types_pb2.JOB_PHASE_PENDING)
    return msg


def test_services_list_each_service_and_its_replicas_linked_to_their_job_pages():
    html = pages.services_section([a_service("zeta"), a_service("web", done=False)])
    tags = Tags(html).tags
    assert [a["data-service"] for t, a in tags if t == "tr" and a.get("class") == "service"] == ["web", "zeta"]
    replicas = [a["data-job"] for t, a in tags if t == "tr" and a.get("class") == "replica"]
    assert replicas == ["web-0", "web-1", "zeta-0", "zeta-1"]
    assert [a["href"] for t, a in tags if t == "a"] == ["/job/web-0", "/job/web-1", "/job/zeta-0", "/job/zeta-1"]
    assert '<td class="ready">1/3</td><td class="revision">2</td>' in html
    assert "rolling out revision 2: 2 of 3 updated, 1 ready" in html and '<td class="endpoints">1</td>' in html
    assert "<td>Running</td><td class=\"replica-ready\">ready</td><td>10.0.0.5:31000</td><td>node-0</td>" in html
    assert "<td>Pending</td><td class=\"replica-ready\">not ready</td><td>-</td><td>-</td>" in html
    assert "no services" in pages.services_section([])


def test_services_are_escaped_and_left_out_where_admission_serves_none():
    evil = a_service(EVIL)
    evil.spec.team, evil.rollout, evil.replica[0].endpoint, evil.replica[0].nodes[0] = EVIL, EVIL, EVIL, EVIL
    html = pages.overview({}, [], [], "x", 0, [evil])
    assert "<script>" not in html and "<h2>Services</h2>" in html
    tags = Tags(html).tags
    assert next(a for t, a in tags if a.get("class") == "service")["data-service"] == EVIL
    assert f"/job/{'%3Cscript%3Ealert%281%29%3C%2Fscript%3E%22%27%26'}-0" in [a["href"] for t, a in tags if t == "a"]
    assert "<h2>Services</h2>" not in pages.overview({}, [], [], "x", 0)
