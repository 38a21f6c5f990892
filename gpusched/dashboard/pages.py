"""The dashboard's HTML: one overview page (pools, node grid, services, queues) and one page per job.
Everything shown is escaped (job names, reasons and labels are user input); no scripts,
no resources from elsewhere: the style is inline and the charts are inline SVG."""
from __future__ import annotations

import time
from collections import defaultdict
from html import escape
from urllib.parse import quote

from gpusched.dashboard.model import (MIG_SLICES, Sample, Step, allocation, fragmentation, gpu_milli_used,
                                      gpu_state)
from gpusched.client import seconds
from gpusched.v1 import types_pb2

STYLE = """
body{font:14px sans-serif;margin:16px;color:#222;background:#fff}
h1{font-size:20px}h2{font-size:16px;margin-top:24px}a{color:#1f5fbf}
table{border-collapse:collapse}td,th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:left}
.grid td{border:none;padding:2px}
.gpu{width:44px;height:34px;border:1px solid #555;position:relative;font-size:10px;text-align:center}
.gpu.free{background:#e8f5e9}.gpu.whole{background:#1565c0;color:#fff}.gpu.faulty{background:#c62828;color:#fff}
.gpu.share{background:#e8f5e9}.gpu.share .fill{background:#ff9800;position:absolute;left:0;bottom:0;top:0}
.gpu.mig{background:#e8f5e9;display:flex}.gpu.mig .slice{flex:1;border-right:1px solid #fff}
.gpu.mig .slice.used{background:#8e24aa}
.cordoned .gpu{outline:3px dashed #555;outline-offset:-3px}.cordoned th{color:#777}
.lost .gpu{opacity:.3}
.legend span{display:inline-block;width:14px;height:14px;border:1px solid #555;vertical-align:middle;margin:0 4px 0 12px}
.muted{color:#777}
"""
LEGEND = [("free", "#e8f5e9", "free"), ("whole", "#1565c0", "whole GPU"), ("share", "#ff9800", "share"),
          ("mig", "#8e24aa", "MIG slices"), ("faulty", "#c62828", "faulty")]
ALLOCATION_COLOUR, FRAGMENTATION_COLOUR = "#1565c0", "#e65100"


def page(title: str, body: str, refresh_s: int = 0) -> str:
    refresh = f'<meta http-equiv="refresh" content="{refresh_s}">' if refresh_s else ""
    return (f'<!DOCTYPE html><html><head><meta charset="utf-8">{refresh}<title>{escape(title)}</title>'
            f'<style>{STYLE}</style></head><body>{body}</body></html>')


def phase_name(phase: int) -> str:
    return types_pb2.JobPhase.Name(phase).removeprefix("JOB_PHASE_").capitalize()


def clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else "-"


def job_link(job: types_pb2.Job) -> str:
    return f'<a href="/job/{quote(job.job_id, safe="")}">{escape(job.spec.name or job.job_id)}</a>'


def overview(history: dict[str, list[Sample]], nodes: list[types_pb2.Node], jobs: list[types_pb2.Job],
             endpoint: str, refresh_s: int, services: list[types_pb2.Service] | None = None) -> str:
    """``services`` None: admission serves none (an older one), and the section is left out."""
    body = (f'<h1>gpusched <span class="muted">{escape(endpoint)}</span></h1>'
            + pools_section(history, nodes) + node_grid(nodes, jobs)
            + (services_section(services) if services is not None else "") + queues(jobs))
    return page("gpusched dashboard", body, refresh_s)


# --- pools ---------------------------------------------------------------------------------
def pools_section(history: dict[str, list[Sample]], nodes: list[types_pb2.Node]) -> str:
    """Each pool's figures now (from the nodes just read) and as sampled over time."""
    members: dict[str, list[types_pb2.Node]] = defaultdict(list)
    for node in nodes:
        members[node.info.pool].append(node)
    rows = []
    for pool in sorted(set(members) | set(history)):
        now = members.get(pool, [])
        rows.append(f'<tr data-pool="{escape(pool)}"><th>{escape(pool)}</th><td>{sum(len(n.gpus) for n in now)}</td>'
                    f'<td class="allocation">{allocation(now):.0%}</td>'
                    f'<td class="fragmentation">{fragmentation(now):.0%}</td>'
                    f'<td>{chart(history.get(pool, []))}</td></tr>')
    return ('<h2>Pools</h2><table class="pools"><tr><th>Pool</th><th>GPUs</th><th>Allocated</th>'
            f'<th>Fragmentation</th><th>Over time (<span style="color:{ALLOCATION_COLOUR}">allocated</span>, '
            f'<span style="color:{FRAGMENTATION_COLOUR}">fragmentation</span>)</th></tr>{"".join(rows)}</table>')


def chart(samples: list[Sample], width: int = 360, height: int = 60) -> str:
    """Allocation and fragmentation (0..1) over the sampled time, as two polylines."""
    if not samples:
        return '<span class="muted">no samples yet</span>'
    t0, t1 = samples[0].t, samples[-1].t
    span = (t1 - t0) or 1.0

    def line(values: list[float], colour: str, name: str) -> str:
        points = " ".join(f"{(s.t - t0) / span * width:.1f},{(1 - v) * (height - 2) + 1:.1f}"
                          for s, v in zip(samples, values))
        return f'<polyline class="{name}" fill="none" stroke="{colour}" stroke-width="2" points="{points}"/>'
    return (f'<svg class="chart" data-samples="{len(samples)}" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">'
            f'<rect width="{width}" height="{height}" fill="#f5f5f5"/>'
            + line([s.allocation for s in samples], ALLOCATION_COLOUR, "allocation")
            + line([s.fragmentation for s in samples], FRAGMENTATION_COLOUR, "fragmentation")
            + f'<title>{clock(t0)} to {clock(t1)}, {len(samples)} samples</title></svg>')


# --- nodes ---------------------------------------------------------------------------------
def holders(jobs: list[types_pb2.Job]) -> dict[tuple[str, int], list[types_pb2.Job]]:
    """(node, GPU index) -> the active jobs with a worker on it."""
    held: dict[tuple[str, int], list[types_pb2.Job]] = defaultdict(list)
    for job in jobs:
        for worker in job.workers:
            for slot in worker.gpus:
                held[(worker.node, slot.index)].append(job)
    return held


def node_grid(nodes: list[types_pb2.Node], jobs: list[types_pb2.Job]) -> str:
    held = holders(jobs)
    legend = "".join(f'<span style="background:{c}"></span>{escape(t)}' for _, c, t in LEGEND)
    rows = []
    for node in sorted(nodes, key=lambda n: (n.info.pool, n.info.name)):
        status = types_pb2.NodeStatus.Name(node.status).removeprefix("NODE_STATUS_").lower()
        cells = "".join(f"<td>{gpu_cell(node.info.name, g, held.get((node.info.name, g.info.index), []))}</td>"
                        for g in node.gpus)
        rows.append(f'<tr class="{status}" data-node="{escape(node.info.name)}" data-status="{status}">'
                    f'<th>{escape(node.info.name)}<br><span class="muted">{escape(node.info.pool)} - '
                    f'{status}</span></th>{cells}</tr>')
    return (f'<h2>Nodes</h2><div class="legend">{legend}<span style="outline:3px dashed #555"></span>cordoned'
            f'</div><table class="grid">{"".join(rows)}</table>')


def gpu_cell(node: str, gpu: types_pb2.Gpu, jobs: list[types_pb2.Job]) -> str:
    state = gpu_state(gpu)
    names = ", ".join(j.spec.name or j.job_id for j in jobs)
    tip = f"{node} GPU {gpu.info.index} {gpu.info.model}: {state}, {gpu_milli_used(gpu) / 1000:g} allocated" + (
        f" ({names})" if names else "")
    inner = f"{gpu.info.index}"
    if state == "share":
        inner = f'<div class="fill" style="width:{gpu.used_milli / 10:.0f}%"></div>{inner}'
    elif state == "mig":
        inner = "".join(f'<div class="slice{" used" if gpu.mig_slices_used >> i & 1 else ""}"></div>'
                        for i in range(MIG_SLICES))
    return (f'<div class="gpu {state}" data-gpu="{gpu.info.index}" data-state="{state}" '
            f'data-milli="{gpu_milli_used(gpu)}" title="{escape(tip)}">{inner}</div>')


# --- services ------------------------------------------------------------------------------
def replica_link(job_id: str) -> str:
    """A replica's job page, as a job's (a replica is a job)."""
    return f'<a href="/job/{quote(job_id, safe="")}">{escape(job_id)}</a>'


def services_section(services: list[types_pb2.Service]) -> str:
    """Each service: its figures and rollout, then a row per replica (job, phase, ready,
    endpoint, node)."""
    rows = []
    for s in sorted(services, key=lambda s: (s.spec.pool, s.spec.name)):
        name = escape(s.spec.name)
        endpoints = sum(1 for r in s.replica if r.ready and r.endpoint)
        rows.append(f'<tr class="service" data-service="{name}"><th>{name}</th><td>{escape(s.spec.team)}</td>'
                    f'<td>{escape(s.spec.pool)}</td><td class="ready">{s.ready}/{s.desired}</td>'
                    f'<td class="revision">{s.revision}</td>'
                    f'<td class="rollout{"" if s.rollout_done else " muted"}">{escape(s.rollout) or "-"}</td>'
                    f'<td class="endpoints">{endpoints}</td></tr>')
        rows += [f'<tr class="replica" data-service="{name}" data-job="{escape(r.job_id)}"><td></td>'
                 f'<td>{replica_link(r.job_id)}</td><td>rev {r.revision}</td><td>{phase_name(r.phase)}</td>'
                 f'<td class="replica-ready">{"ready" if r.ready else "not ready"}</td>'
                 f'<td>{escape(r.endpoint) or "-"}</td><td>{escape(", ".join(r.nodes)) or "-"}</td></tr>'
                 for r in s.replica]
    if not rows:
        return '<h2>Services</h2><p class="muted">no services</p>'
    return ('<h2>Services</h2><table class="services"><tr><th>Service</th><th>Team</th><th>Pool</th>'
            f'<th>Ready</th><th>Revision</th><th>Rollout</th><th>Endpoints</th></tr>{"".join(rows)}</table>')


# --- queues --------------------------------------------------------------------------------
def queues(jobs: list[types_pb2.Job], now: float | None = None) -> str:
    now = time.time() if now is None else now
    by_team: dict[tuple[str, str], list[types_pb2.Job]] = defaultdict(list)
    running: dict[tuple[str, str], int] = defaultdict(int)
    for job in jobs:
        key = (job.spec.pool, job.spec.team)
        if job.phase == types_pb2.JOB_PHASE_PENDING:
            by_team[key].append(job)
        else:
            running[key] += 1
    sections = []
    for pool, team in sorted(set(by_team) | set(running)):
        pending = sorted(by_team[(pool, team)], key=lambda j: seconds(j.submitted_at))
        rows = "".join(f'<tr class="pending" data-job="{escape(j.job_id)}"><td>{job_link(j)}</td>'
                       f'<td>{j.spec.workers}x{escape(gpus_of(j.spec.resources))}</td>'
                       f'<td>{escape(j.spec.priority_class)}</td><td>{int(now - seconds(j.submitted_at))}s</td>'
                       f'<td class="reason">{escape(j.reason) or "-"}</td>'
                       f'<td class="why">{escape(why_pending(j)) or "-"}</td></tr>' for j in pending)
        sections.append(f'<h3 data-queue="{escape(pool)}/{escape(team)}">{escape(team)} '
                        f'<span class="muted">pool {escape(pool)}: {running[(pool, team)]} running, '
                        f'{len(pending)} pending</span></h3>'
                        + (f'<table class="queue"><tr><th>Job</th><th>GPUs</th><th>Class</th><th>Waiting</th>'
                           f'<th>Reason</th><th>Why pending</th></tr>{rows}</table>' if pending else ""))
    return "<h2>Queues</h2>" + ("".join(sections) or '<p class="muted">no active jobs</p>')


def why_pending(job: types_pb2.Job) -> str:
    """The placer's reason a pending job waits (docs/guide/why-pending.md); "" where it gave none."""
    return job.pending.summary if job.phase == types_pb2.JOB_PHASE_PENDING and job.HasField("pending") else ""


def gpus_of(resources: types_pb2.WorkerResources) -> str:
    if resources.mig_profile:
        return resources.mig_profile
    return f"{resources.gpu_milli / 1000:g}" if resources.gpu_milli else str(resources.gpus)


# --- a job ---------------------------------------------------------------------------------
def job_page(job: types_pb2.Job, steps: list[Step], now: float | None = None) -> str:
    s = job.spec
    fields = [("Job", job.job_id), ("Team", s.team), ("Pool", s.pool), ("Phase", phase_name(job.phase)),
              ("Reason", job.reason or "-"), ("Why pending", why_pending(job) or "-"), ("Class", s.priority_class),
              ("Workers", f"{s.workers} x {gpus_of(s.resources)} GPU"), ("Attempt", str(job.attempt)),
              ("Restarts", str(job.restarts)), ("Preemptions", str(job.preemptions))]
    table = "".join(f'<tr><th>{escape(k)}</th><td class="{escape(k.lower())}">{escape(v)}</td></tr>'
                    for k, v in fields)
    workers = "".join(f"<li>worker {w.worker}: {escape(w.node)} GPUs "
                      f"{escape(', '.join(str(g.index) for g in w.gpus))}</li>" for w in job.workers)
    items = "".join(f'<li data-step="{escape(st.label)}"><b>{clock(st.t)}</b> {escape(st.label)}'
                    f'{" <span class=muted>" + escape(st.detail) + "</span>" if st.detail else ""}</li>'
                    for st in steps)
    body = (f'<p><a href="/">&larr; cluster</a></p><h1 class="job-name">{escape(s.name or job.job_id)}</h1>'
            f'<table class="fields">{table}</table>'
            + (f"<h2>Workers</h2><ul>{workers}</ul>" if workers else "")
            + f'<h2>Timeline</h2>{bar(job, now)}<ol class="timeline">{items}</ol>')
    return page(f"{s.name or job.job_id} - gpusched", body)


def bar(job: types_pb2.Job, now: float | None = None, width: int = 480) -> str:
    """Waiting (submitted to started) and running (started to ended, or now) as one bar."""
    submitted = seconds(job.submitted_at)
    if not submitted:
        return ""
    end = seconds(job.ended_at) or (time.time() if now is None else now)
    span = max(end - submitted, 1e-6)
    start = seconds(job.started_at) or end

    def x(t: float) -> float:
        return (t - submitted) / span * width
    return (f'<svg class="bar" width="{width}" height="18" xmlns="http://www.w3.org/2000/svg">'
            f'<rect class="waiting" x="0" y="2" width="{x(start):.1f}" height="14" fill="#bdbdbd"/>'
            f'<rect class="running" x="{x(start):.1f}" y="2" width="{width - x(start):.1f}" height="14" '
            f'fill="#1565c0"/></svg>')


def error_page(status: int, message: str) -> str:
    return page(f"{status} - gpusched", f'<p><a href="/">&larr; cluster</a></p><h1>{status}</h1>'
                                        f'<p class="error">{escape(message)}</p>')
