"""The dashboard end to end: a LocalCluster on the real broker (admission, placer,
simulated node-agents as processes), ``gpusched dashboard`` as a process, and its pages
loaded in headless Chromium: the rendered DOM (``--dump-dom``, after the page's own
scripts would have run) and a screenshot."""
from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sys
import urllib.request
from html.parser import HTMLParser
from urllib.parse import quote

import grpc
import pytest
from PIL import Image

from gpusched.client import Client, spec
from gpusched.local_cluster import LocalCluster
from gpusched.v1 import node_agent_pb2, node_agent_pb2_grpc, types_pb2
from tests.polling import eventually_async

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (deploy/setup.sh installs it when root: "
                                                         "apt-get install chromium)")
RUNNING = types_pb2.JOB_PHASE_RUNNING
EVIL = "<script>document.title='owned'</script><i>slanted</i>"
WIDTH, HEIGHT = 1200, 900


class Element:
    def __init__(self, tag: str, attrs: dict[str, str], parent: "Element | None") -> None:
        self.tag, self.attrs, self.parent, self.children, self.text = tag, attrs, parent, [], ""

    def all(self, tag: str = "", **attrs: str) -> list["Element"]:
        """Descendants with the tag (any if "") whose attributes hold the given values (a
        class matches one of the element's classes)."""
        found = []
        for child in self.children:
            if (not tag or child.tag == tag) and all(
                    v in child.attrs.get(k.rstrip("_"), "").split() if k == "class_" else child.attrs.get(k) == v
                    for k, v in attrs.items()):
                found.append(child)
            found += child.all(tag, **attrs)
        return found

    def one(self, tag: str = "", **attrs: str) -> "Element":
        found = self.all(tag, **attrs)
        assert len(found) == 1, f"{len(found)} <{tag} {attrs}>"
        return found[0]

    def content(self) -> str:
        return self.text + "".join(c.content() for c in self.children)


class Dom(HTMLParser):
    """Chromium's serialized DOM as a tree of Elements."""

    VOID = {"meta", "br", "link", "img", "input", "hr", "rect", "polyline"}

    def __init__(self, html: str) -> None:
        super().__init__()
        self.root = self.at = Element("#document", {}, None)
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        element = Element(tag, {k: v or "" for k, v in attrs}, self.at)
        self.at.children.append(element)
        if tag not in self.VOID:
            self.at = element

    def handle_endtag(self, tag):
        node = self.at
        while node.parent is not None and node.tag != tag:
            node = node.parent
        if node.parent is not None:
            self.at = node.parent

    def handle_data(self, data):
        self.at.text += data


async def chromium(tmp_path, url: str, *flags: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'chromium-profile'}", f"--window-size={WIDTH},{HEIGHT}", *flags, url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()[-2000:]
    return out.decode()


async def dom(tmp_path, url: str) -> Element:
    return Dom(await chromium(tmp_path, url, "--dump-dom")).root


async def until(client: Client, job_ids: set[str], phase: int) -> list[types_pb2.Job]:
    seen: dict[str, types_pb2.Job] = {}
    async for update in client.watch():
        if update.job.job_id in job_ids and update.job.phase == phase:
            seen[update.job.job_id] = update.job
            if set(seen) == job_ids:
                return list(seen.values())


@pytest.fixture
async def dashboard(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs")
    admission = await cluster.admission()
    await cluster.placer()
    agents = {name: await cluster.agent(name, "4xH100-80GB") for name in ("node-0", "node-1")}
    await cluster.agent("node-2", "2xA100-80GB")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpusched.cli", "--endpoint", f"127.0.0.1:{admission.port}", "dashboard",
        "--listen", "127.0.0.1:0", "--interval", "0.2", "--refresh", "0",
        env={**os.environ, "GPUSCHED_CONFIG": str(tmp_path / "no-config.yaml")},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
    assert line.startswith("dashboard: serving http://"), line
    url = line.split()[2].rstrip("/")
    client = Client(f"127.0.0.1:{admission.port}")
    yield cluster, agents, client, url
    proc.terminate()
    await proc.wait()
    await client.close()
    await cluster.stop_all()


def fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def test_pages_in_headless_chromium(dashboard, tmp_path):
    cluster, agents, client, url = dashboard
    await client.cordon("node-2", "maintenance")   # the A100s
    # the H100s: 4 whole on one node; a share, a MIG slice and 2 whole GPUs on the other
    async def run(*jobs: tuple[str, dict]) -> dict[str, types_pb2.Job]:
        ids = {(await client.submit(spec(name, "nlp", duration=600, models=("H100-80GB",), **kw))).job.job_id: name
               for name, kw in jobs}
        return {ids[j.job_id]: j for j in await asyncio.wait_for(until(client, set(ids), RUNNING), 120)}
    full = (await run(("big", dict(gpus=4))))["big"].workers[0].node
    running = await run(("shared", dict(gpu_milli=250)), ("sliced", dict(mig="3g")), ("pair", dict(gpus=2)))
    # a GPU of the pair's fails: the pair goes back to wait, with nowhere to go
    pair = running["pair"]
    node, gpu = pair.workers[0].node, max(slot.index for slot in pair.workers[0].gpus)
    assert node != full
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{agents[node].port}")
    await node_agent_pb2_grpc.NodeAgentServiceStub(channel).InjectGpuFault(
        node_agent_pb2.InjectGpuFaultRequest(gpu_index=gpu, xid=79))
    await channel.close()
    requeued = (await asyncio.wait_for(until(client, {pair.job_id}, types_pb2.JOB_PHASE_PENDING), 120))[0]
    assert requeued.reason, requeued
    waiting = (await client.submit(spec("waits", "cv", gpus=4, duration=600, models=("H100-80GB",)))).job.job_id
    # names are checked by admission; a cancellation's reason is free text
    doomed = (await client.submit(spec("doomed", "cv", gpus=4, models=("H100-80GB",)))).job.job_id
    await client.cancel(doomed, EVIL)

    # the chart wants a few samples
    last: list[str] = []

    async def settled() -> Element | None:   # the page is rendered again each time: no pause
        html = await chromium(tmp_path, url + "/", "--dump-dom")
        last[:] = [html]
        page = Dom(html).root
        charts = page.all("svg", class_="chart")
        rows = page.all("tr", **{"data-job": waiting})
        if rows and rows[0].one("td", class_="why").content() != "-" and charts and all(
                int(c.attrs["data-samples"]) >= 3 for c in charts):
            return page
        return None
    try:
        page = await eventually_async(settled, "a pending job and samples on the page", 120, poll=0)
    except AssertionError:
        pytest.fail(f"no pending job or samples on the page:\n{last[0] if last else '(no page)'}")

    assert page.one("head").one("title").content() == "gpusched dashboard"
    grid_rows = page.one("table", class_="grid").all("tr")
    grid = {(row.attrs["data-node"], cell.attrs["data-gpu"]): cell.attrs["data-state"]
            for row in grid_rows for cell in row.all("div", class_="gpu")}
    assert [grid[(full, str(i))] for i in range(4)] == ["whole"] * 4
    assert sorted(grid[(node, str(i))] for i in range(4)) == ["faulty", "free", "mig", "share"]
    assert grid[(node, str(gpu))] == "faulty"
    assert grid[("node-2", "0")] == grid[("node-2", "1")] == "free"
    statuses = {r.attrs["data-node"]: r.attrs["data-status"] for r in grid_rows}
    assert statuses == {"node-0": "ready", "node-1": "ready", "node-2": "cordoned"}
    share = next(c for c in page.all("div", class_="gpu") if c.attrs["data-state"] == "share")
    assert share.attrs["data-milli"] == "250" and "(shared)" in share.attrs["title"]

    # the queues: each pending job with the reason the API gives ("-" for none)
    queue = page.one("tr", **{"data-job": waiting})
    assert "waits" in queue.content() and queue.one("a").attrs["href"] == f"/job/{waiting}"
    for job_id in (waiting, pair.job_id):
        reason = (await client.get(job_id)).reason
        assert page.one("tr", **{"data-job": job_id}).one("td", class_="reason").content() == (reason or "-")
    assert "unhealthy" in page.one("tr", **{"data-job": pair.job_id}).one("td", class_="reason").content()
    # why the job that cannot fit waits, as the placer found it: no node has 4 free H100s
    # The blocked head of line holds a reservation by default (docs/guide/why-pending.md).
    no_fit = "0/3 nodes are available: 2 not enough free GPUs, 1 cordoned. Capacity is reserved for it (backfill)."
    assert (await client.get(waiting)).pending.summary == no_fit
    assert page.one("tr", **{"data-job": waiting}).one("td", class_="why").content() == no_fit
    assert page.one("h3", **{"data-queue": "default/cv"}).content().endswith("0 running, 1 pending")
    assert page.one("h3", **{"data-queue": "default/nlp"}).content().endswith("3 running, 1 pending")
    pool = page.one("tr", **{"data-pool": "default"})
    # the MIG slice as the API reports it: its memory slices drawn as used
    mig_gpu = next(g for g in (await client.node(node)).gpus if g.mig_slices_used)
    slices = bin(mig_gpu.mig_slices_used).count("1")
    mig_cell = next(c for c in page.all("div", class_="gpu") if c.attrs["data-state"] == "mig")
    assert len(mig_cell.all("div", class_="used")) == slices and len(mig_cell.all("div", class_="slice")) == 8
    # 4 whole + 0.25 + the 3g slice's 3 of 7 compute slices, of the 7 schedulable GPUs
    # (node-2 cordoned, one GPU faulty): a slice counts as a job's usage does
    assert mig_gpu.allocated_milli == 428
    assert pool.one("td", class_="allocation").content() == f"{(4 + 0.25 + 0.428) / 7:.0%}"
    # of the free GPUs (the whole free one and what is left of two), those left of two
    stranded = 0.75 + (1 - 0.428)
    assert pool.one("td", class_="fragmentation").content() == f"{stranded / (1 + stranded):.0%}"
    assert len(pool.one("polyline", class_="allocation").attrs["points"].split()) >= 3

    # the job pages: fields and the timeline; markup in a reason shown as text, not run
    job_page = await dom(tmp_path, f"{url}/job/{quote(running['shared'].job_id)}")
    assert job_page.one("h1", class_="job-name").content() == "shared"
    assert job_page.one("td", class_="phase").content() == "Running"
    steps = [li.attrs["data-step"] for li in job_page.one("ol", class_="timeline").all("li")]
    assert [s for s in steps if s in ("Submitted", "Placed", "Started")] == ["Submitted", "Placed", "Started"]
    assert {"JobPlaced", "WorkerStarted"} <= set(steps), steps
    waiting_page = await dom(tmp_path, f"{url}/job/{waiting}")
    assert waiting_page.one("td", class_="why").content() == no_fit
    pending_page = await dom(tmp_path, f"{url}/job/{pair.job_id}")
    assert pending_page.one("td", class_="reason").content() == requeued.reason
    assert pending_page.one("td", class_="phase").content() == "Pending"
    assert pending_page.one("td", class_="attempt").content() == "1"

    cancelled = await dom(tmp_path, f"{url}/job/{doomed}")
    assert cancelled.one("head").one("title").content() == "doomed - gpusched"
    assert not cancelled.all("script") and not cancelled.all("i")
    assert cancelled.one("td", class_="reason").content() == EVIL
    assert cancelled.one("td", class_="phase").content() == "Cancelled"
    assert EVIL in cancelled.one("ol", class_="timeline").content()

    status, body = await asyncio.to_thread(fetch, f"{url}/job/job-none")
    assert status == 404 and "NOT_FOUND" in body

    # the screenshot: a PNG of the window's size, the grid's colours in it, each on more
    # pixels than the legend's swatch holds (so the cells show them, not just the legend)
    shot = tmp_path / "overview.png"
    await chromium(tmp_path, url + "/", f"--screenshot={shot}")
    image = Image.open(shot)
    assert image.format == "PNG" and image.size == (WIDTH, HEIGHT)
    pixels = {colour: count for count, colour in image.convert("RGB").getcolors(WIDTH * HEIGHT)}
    for css in ("#1565c0", "#ff9800", "#8e24aa", "#c62828", "#e8f5e9"):   # whole, share, MIG, faulty, free
        assert pixels.get(tuple(int(css[i:i + 2], 16) for i in (1, 3, 5)), 0) > 14 * 14, css

    # a service: its replica, on the node's one free GPU once the 4-GPU job no longer
    # waits, listed under Services and linked to its job page
    await client.cancel(waiting)
    template = spec("", "", gpus=1, duration=600, models=("H100-80GB",))
    await client.apply_service(types_pb2.ServiceSpec(name="chat", team="nlp", replicas=1, template=template))

    async def serving() -> Element | None:
        page = await dom(tmp_path, url + "/")
        rows = page.all("tr", class_="service")
        return page if rows and rows[0].one("td", class_="ready").content() == "1/1" else None
    page = await eventually_async(serving, "the service's replica ready on the page", 120, poll=0)
    service_row = page.one("tr", class_="service")
    assert service_row.attrs["data-service"] == "chat" and service_row.one("td", class_="endpoints").content() == "1"
    assert service_row.one("td", class_="rollout").content() == "complete"
    replica = page.one("tr", class_="replica")
    replica_id = replica.attrs["data-job"]
    assert replica_id.startswith("chat-") and replica.one("a").attrs["href"] == f"/job/{replica_id}"
    assert replica.one("td", class_="replica-ready").content() == "ready" and node in replica.content()


async def test_unavailable_admission_is_a_clear_error_page(tmp_path):
    """No cluster: the page says which admission could not be reached, with a 503."""
    with socket.socket() as s:   # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpusched.cli", "--endpoint", f"127.0.0.1:{port}", "dashboard", "--listen", "127.0.0.1:0",
        env={**os.environ, "GPUSCHED_CONFIG": str(tmp_path / "no-config.yaml")},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        url = line.split()[2].rstrip("/")
        status, body = await asyncio.to_thread(fetch, url + "/")
        assert status == 503 and f"admission at 127.0.0.1:{port}: UNAVAILABLE" in body, body
        page = Dom(await chromium(tmp_path, url + "/job/job-1", "--dump-dom")).root
        assert f"127.0.0.1:{port}: UNAVAILABLE" in page.one("p", class_="error").content()
        assert (await asyncio.to_thread(fetch, url + "/nothing"))[0] == 404
        assert await asyncio.to_thread(fetch, url + "/healthz") == (200, "ok\n")
    finally:
        proc.terminate()
        await proc.wait()
