"""Service commands: apply, get services|endpoints, describe service, scale, delete
service, rollout status|undo, top services (docs/reference/cli.md, "Services")."""
from __future__ import annotations

import time
from pathlib import Path

import click

from gpusched.client import SyncClient, seconds
from gpusched.ctl import jobfile
from gpusched.ctl.jobs import HOLDING, describe, get
from gpusched.ctl.nodes import top
from gpusched.ctl.output import (age, as_dict, dump, echo_lines, gpu_count, gpus_of, milli_of, output_option,
                                 phase_name, table)
from gpusched.ctl.root import pass_client
from gpusched.lb import ServiceDeleted, keep_nginx
from gpusched.v1 import admission_pb2, types_pb2


def _span(text: str) -> float:
    try:
        return jobfile.span_seconds(float(text) if text.replace(".", "", 1).isdigit() else text, "--timeout")
    except jobfile.JobFileError as exc:
        raise click.BadParameter(str(exc).removeprefix("--timeout: "), param_hint="--timeout") from None


# --- apply -------------------------------------------------------------------------------
@click.command()
@click.option("-f", "--filename", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="a service file (YAML; ServiceSpec fields, docs/reference/cli.md)")
@click.option("-o", "--output", type=click.Choice(["name", "json", "yaml"]), default="name")
@pass_client
def apply(client: SyncClient, filename: Path, output: str) -> None:
    """Create services from a file, or change them (a changed template rolls out)."""
    specs = [jobfile.parse_service(doc, where) for doc, where in jobfile.located(jobfile.load_docs(filename), filename)]
    shown = []
    for s in specs:
        service = client.apply_service(s)
        if output == "name":
            echo_lines([f"service/{service.spec.name} applied (revision {service.revision}, "
                        f"{service.desired} replicas)"])
        shown.append(as_dict(service))
    if output != "name":
        dump(shown, output)


# --- get ---------------------------------------------------------------------------------
SERVICE_COLUMNS = [("NAME", lambda s: s.spec.name), ("TEAM", lambda s: s.spec.team), ("POOL", lambda s: s.spec.pool),
                   ("READY", lambda s: f"{s.ready}/{s.desired}"), ("UP-TO-DATE", lambda s: str(s.updated)),
                   ("REVISION", lambda s: str(s.revision)), ("AGE", lambda s: age(s.created_at))]
SERVICE_WIDE = [("GPUS", lambda s: _gpus(s.spec.template)), ("ROLLOUT", lambda s: s.rollout)]


def _gpus(template: types_pb2.JobSpec) -> str:
    per = gpus_of(template.resources)
    return per if template.workers <= 1 else f"{template.workers}x{per}"


@get.command("services")
@click.option("--team", default="")
@click.option("--pool", default="")
@output_option
@pass_client
def get_services(client: SyncClient, team: str, pool: str, output: str) -> None:
    """Services: ready of desired replicas, those of the current revision, the revision."""
    table(client.list_services(team, pool), SERVICE_COLUMNS, SERVICE_WIDE, output)


def endpoint_lines(endpoints: admission_pb2.Endpoints) -> list[str]:
    """``address:port replica revision``, a line each."""
    return [f"{e.address}:{e.port} {e.replica} {e.revision}" for e in endpoints.endpoints]


@get.command("endpoints")
@click.argument("name")
@click.option("-w", "--watch", is_flag=True, help="print the list again at every change, until interrupted")
@pass_client
def get_endpoints(client: SyncClient, name: str, watch: bool) -> None:
    """The service's ready replicas: ``address:port replica revision``."""
    for update in client.watch_endpoints(name):
        if update.deleted:
            raise click.ClickException(f"service {name} deleted")
        if watch:
            echo_lines([f"# {time.strftime('%H:%M:%S')} {len(update.endpoints)} ready"])
        lines = endpoint_lines(update)
        if lines:
            echo_lines(lines)
        if not watch:
            return


# --- describe ----------------------------------------------------------------------------
def _metric(policy: types_pb2.AutoscalingPolicy) -> str:
    return types_pb2.ScalingMetric.Name(policy.metric).removeprefix("SCALING_METRIC_").lower()


def service_lines(service: types_pb2.Service) -> list[str]:
    s, t = service.spec, service.spec.template
    r = t.resources
    bound = f"{s.min_replicas}..{s.max_replicas or 'no bound'}"
    lines = [f"Service:      {s.name}", f"Team:         {s.team}" + (f" (org {s.org})" if s.org else ""),
             f"Pool:         {s.pool}", f"Priority:     {s.priority_class}",
             f"Preemptible:  {'yes' if s.preemptible else 'no'}",
             f"Replicas:     {service.desired} desired ({bound}; {service.scaled_reason or '-'}), "
             f"{service.replicas} live, {service.updated} up to date, {service.ready} ready",
             f"Per replica:  {t.workers or 1} worker(s) of GPUs {gpus_of(r)}, CPU {r.cpu_milli}m, "
             f"memory {r.memory_mib} MiB" + (f", models {', '.join(r.gpu_models)}" if r.gpu_models else "")]
    if t.command:
        lines.append(f"Command:      {' '.join(t.command)}")
    if t.serve_port:
        lines.append("Port:         given in PORT")
    if t.readiness.http_path or t.readiness.command:
        check = f"GET {t.readiness.http_path}" if t.readiness.http_path else " ".join(t.readiness.command)
        lines.append(f"Readiness:    {check}")
    lines.append(f"Update:       max surge {s.update.max_surge}, max unavailable {s.update.max_unavailable}")
    if s.autoscaling.metric:
        lines.append(f"Autoscaling:  {_metric(s.autoscaling)} target {s.autoscaling.target:g} per replica")
    lines += [f"Revision:     {service.revision}"
              + (f" (kept: {', '.join(map(str, service.revisions))})" if len(service.revisions) > 1 else ""),
              f"Rollout:      {service.rollout}"]
    if seconds(service.created_at):
        lines.append(f"Created:      {age(service.created_at)} ago")
    if service.replaced:
        lines.append(f"Replaced:     {service.replaced} replicas that ended")
    if service.replica:
        lines.append("Replicas:")
        for rep in service.replica:
            lines.append(f"  {rep.job_id:<16} rev {rep.revision:<3} {phase_name(rep.phase):<10} "
                         f"{'ready' if rep.ready else 'not ready':<10} {rep.endpoint or '-':<22} "
                         f"{','.join(rep.nodes) or '-'}")
    reasons = [(rep.job_id, rep.reason) for rep in service.replica if rep.reason]
    if reasons:
        lines.append("Reasons:")
        lines += [f"  {job_id}: {reason}" for job_id, reason in reasons]
    return lines


@describe.command("service")
@click.argument("name")
@click.option("-o", "--output", type=click.Choice(["text", "json", "yaml"]), default="text")
@pass_client
def describe_service(client: SyncClient, name: str, output: str) -> None:
    """A service: its spec, revision, rollout, and each replica with its phase, readiness,
    endpoint and node."""
    service = client.get_service(name)
    if output != "text":
        dump(as_dict(service), output)
        return
    echo_lines(service_lines(service))


# --- top ---------------------------------------------------------------------------------
REASON_WIDTH = 24


def short(text: str, width: int = REASON_WIDTH) -> str:
    """``text`` cut to ``width`` characters, the cut marked with "..."; "-" when empty."""
    if not text:
        return "-"
    return text if len(text) <= width else text[:width - 3].rstrip() + "..."


def _gpus_held(job: types_pb2.Job | types_pb2.JobSpec) -> float:
    spec = job.spec if isinstance(job, types_pb2.Job) else job
    return max(spec.workers, 1) * milli_of(spec.resources) / 1000


def held_gpus(service: types_pb2.Service, jobs: dict[str, types_pb2.Job]) -> float:
    """GPUs the service's live replicas hold (those placed or running): each replica's job
    from ``jobs`` (by id), or the current template where the job is not among them."""
    return sum(_gpus_held(jobs.get(rep.job_id) or service.spec.template)
               for rep in service.replica if rep.phase in HOLDING)


def top_rows(services: list[types_pb2.Service], jobs: list[types_pb2.Job]) -> list[dict]:
    by_id = {j.job_id: j for j in jobs}
    return [{"service": s.spec.name, "team": s.spec.team, "pool": s.spec.pool, "ready": s.ready,
             "desired": s.desired, "replicas": s.replicas, "updated": s.updated, "revision": s.revision,
             "gpus_allocated": held_gpus(s, by_id), "scaled_reason": s.scaled_reason,
             "rollout": s.rollout, "rollout_done": s.rollout_done}
            for s in sorted(services, key=lambda s: s.spec.name)]


TOP_COLUMNS = [("NAME", lambda r: r["service"]), ("TEAM", lambda r: r["team"]), ("POOL", lambda r: r["pool"]),
               ("READY", lambda r: f"{r['ready']}/{r['desired']}"), ("UPDATED", lambda r: str(r["updated"])),
               ("REVISION", lambda r: str(r["revision"])), ("GPUS", lambda r: gpu_count(r["gpus_allocated"])),
               ("SCALED", lambda r: short(r["scaled_reason"])), ("ROLLOUT", lambda r: r["rollout"] or "-")]


@top.command("services")
@click.option("--team", default="")
@click.option("--pool", default="")
@output_option
@pass_client
def top_services(client: SyncClient, team: str, pool: str, output: str) -> None:
    """Per service: ready of desired replicas, those of the current revision, the GPUs its
    replicas hold, why it has its count, its rollout."""
    jobs = client.list_all(team, pool, tuple(HOLDING))
    table(top_rows(client.list_services(team, pool), jobs), TOP_COLUMNS, fmt=output, objects=lambda r: r)


# --- scale, delete -----------------------------------------------------------------------
@click.command()
@click.argument("name")
@click.option("--replicas", type=int, required=True, help="the desired count, within min..max replicas")
@click.option("--reason", default="", help="recorded with the change")
@pass_client
def scale(client: SyncClient, name: str, replicas: int, reason: str) -> None:
    """Set a service's desired replica count."""
    service = client.scale_service(name, replicas, reason)
    echo_lines([f"service/{service.spec.name} scaled to {service.desired}"])


@click.group()
def delete() -> None:
    """Delete a service (its replicas are stopped)."""


@delete.command("service")
@click.argument("name")
@pass_client
def delete_service(client: SyncClient, name: str) -> None:
    """Delete a service; its replicas are cancelled."""
    service = client.delete_service(name)
    echo_lines([f"service/{service.spec.name} deleted ({service.replicas} replicas stopping)"])


# --- rollout -----------------------------------------------------------------------------
@click.group()
def rollout() -> None:
    """Follow or undo a service's rollout."""


@rollout.command("status")
@click.argument("name")
@click.option("--timeout", "timeout", default="5m", help="give up after this span (600, 90s, 5m)")
@click.option("--poll", default=1.0, hidden=True, type=float)
@pass_client
def rollout_status(client: SyncClient, name: str, timeout: str, poll: float) -> None:
    """Wait until the service's rollout is complete (exit status 0); 1 if it is stalled or
    the timeout passes first."""
    deadline = time.monotonic() + _span(timeout)
    said = ""
    while True:
        service = client.get_service(name)
        if service.rollout != said:
            said = service.rollout
            echo_lines([f"service/{name}: {said}"])
        if service.rollout_done:
            return
        if said.startswith("stalled"):
            raise SystemExit(1)
        if time.monotonic() >= deadline:
            raise click.ClickException(f"timed out after {timeout} waiting for service {name}'s rollout")
        time.sleep(poll)   # GetService again: the rollout's words change with the clock too


@rollout.command("undo")
@click.argument("name")
@click.option("--to-revision", type=int, default=0, help="a kept revision [the previous one]")
@pass_client
def rollout_undo(client: SyncClient, name: str, to_revision: int) -> None:
    """Roll the service back to an earlier template: a new revision with its template."""
    service = client.rollback_service(name, to_revision)
    echo_lines([f"service/{service.spec.name} rolled back (now revision {service.revision})"])


# --- lb ----------------------------------------------------------------------------------
@click.group()
def lb() -> None:
    """Keep a load balancer's upstream list equal to a service's ready replicas."""


@lb.command("nginx")
@click.argument("name")
@click.option("--upstream-file", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="the file nginx includes: this service's upstream block, rewritten at every change")
@click.option("--reload-command", default="nginx -s reload", show_default=True,
              help="run after each rewrite (empty: none)")
@click.option("--activator-port", type=int, default=None,
              help="serve the activator here (0: a free port): a request while no replica is ready asks for one")
@click.option("--activator-host", default="127.0.0.1", show_default=True)
@pass_client
def lb_nginx(client: SyncClient, name: str, upstream_file: Path, reload_command: str,
             activator_port: int | None, activator_host: str) -> None:
    """Follow service NAME's endpoints into nginx's upstream ``gpusched_NAME`` until
    interrupted (docs/guide/inference.md, "Endpoints and a load balancer")."""
    def started(at: str) -> None:
        click.echo(f"keeping {upstream_file} for service {name}" + (f"; activator on {at}" if at else ""), err=True)
    try:
        client.run(keep_nginx(client.aio, name, upstream_file, reload_command, activator_host, activator_port,
                              started))
    except ServiceDeleted:
        raise click.ClickException(f"service {name} deleted") from None
