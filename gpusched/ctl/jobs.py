"""Job commands: submit, get jobs|queues, describe job, cancel, watch."""
from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import click

from gpusched.client import TERMINAL, SyncClient, seconds
from gpusched.ctl import jobfile
from gpusched.ctl.output import (age, as_dict, clock, dump, echo_lines, gpu_count, gpus_of, milli_of, output_option,
                                 phase_name, table)
from gpusched.ctl.root import pass_client
from gpusched.v1 import types_pb2

HOLDING = {types_pb2.JOB_PHASE_PLACED, types_pb2.JOB_PHASE_RUNNING, types_pb2.JOB_PHASE_PREEMPTING,
           types_pb2.JOB_PHASE_STOPPING}
PHASES = [phase_name(p).lower() for p in types_pb2.JobPhase.values() if p]


# --- submit ----------------------------------------------------------------------------
def _span(value: str) -> float | str:
    """A span flag as a job file takes it: seconds, or amounts with units (checked there)."""
    try:
        return float(value)
    except ValueError:
        return value


def _flag_fields(o: dict) -> dict:
    """The flags given, as job-file fields (the file's values, overridden)."""
    fields = {k: v for k, v in (("name", o["name"]), ("team", o["team"]), ("pool", o["pool"]),
                                ("priority_class", o["priority"]), ("workers", o["workers"]),
                                ("org", o["org"]), ("simulated_duration", o["duration"]),
                                ("max_runtime", o["max_runtime"]), ("preemptible", o["preemptible"]),
                                ("checkpoint_interval", o["checkpoint_interval"]), ("kind", o["kind"]))
              if v is not None}
    resources = {k: v for k, v in (("gpus", o["gpus"]), ("gpu_milli", o["gpu_milli"]), ("mig_profile", o["mig"]),
                                   ("cpu_milli", o["cpu_milli"]), ("memory_mib", o["memory_mib"])) if v is not None}
    if o["gpu_model"]:
        resources["gpu_models"] = list(o["gpu_model"])
    if resources:
        fields["resources"] = resources
    if o["command"]:
        fields["command"] = list(o["command"])
    if o["after"]:
        fields["depends_on"] = [_dependency(text) for text in o["after"]]
    return fields


def _dependency(text: str) -> dict:
    """``ID`` or ``ID:succeeded|finished|failed`` (``--after``), as a job file's entry."""
    job, _, when = text.partition(":")
    if not job:
        raise click.BadParameter(f"a job id, then :succeeded, :finished or :failed if not the first; got {text!r}",
                                 param_hint="--after")
    return {"job": job, "when": when or "succeeded"}


def _merge(doc: object, flags: dict) -> object:
    if not isinstance(doc, dict):
        return doc   # jobfile.parse says what is wrong with it
    merged = {**doc, **flags}
    if "resources" in flags and isinstance(doc.get("resources"), dict):
        merged["resources"] = {**doc["resources"], **flags["resources"]}
    return merged


@click.command(context_settings={"show_default": True})
@click.option("-f", "--filename", type=click.Path(dir_okay=False, path_type=Path),
              help="a job file (YAML; JobSpec fields, docs/reference/cli.md); flags override its values")
@click.option("--name")
@click.option("--team", help="default: the caller's team (from its credentials)")
@click.option("--pool", help="[default]")
@click.option("--priority", help="production-inference | training-high | training | best-effort [training]")
@click.option("--kind", type=click.Choice(["training", "inference"]),
              help="inference: a serving job, which preempts lower classes at once [training]")
@click.option("--workers", type=int, help="gang size, all or nothing [1]")
@click.option("--gpus", type=int, help="whole GPUs per worker")
@click.option("--gpu-milli", type=int, help="a share of one GPU per worker, in thousandths (250: a quarter)")
@click.option("--mig", help="a MIG slice per worker (1g, 3g.40gb, ...)")
@click.option("--gpu-model", multiple=True, help="allowed GPU model (repeat); none: any")
@click.option("--cpu-milli", type=int, help="[1000]")
@click.option("--memory-mib", type=int, help="[4096]")
@click.option("--org")
@click.option("--duration", type=_span, help="run time on simulated nodes (600, 90s, 10m, 1h30m)")
@click.option("--max-runtime", type=_span, help="time limit (a span)")
@click.option("--checkpoint-interval", type=_span, help="time between checkpoints (a span)")
@click.option("--preemptible/--no-preemptible", default=None, help="may be preempted [preemptible]")
@click.option("--after", multiple=True, metavar="ID[:WHEN]",
              help="wait for job ID to end (repeat); WHEN: succeeded (default), finished or failed")
@click.option("--key", help="idempotency key: submitting again with it answers the same job [a new one]")
@click.option("-o", "--output", type=click.Choice(["name", "json", "yaml"]), default="name")
@click.argument("command", nargs=-1)
@pass_client
def submit(client: SyncClient, filename: Path | None, key: str | None, output: str, **flags) -> None:
    """Submit jobs from a job file and/or flags; COMMAND (after --) is what each worker runs.

    \b
      gpusched submit -f job.yaml
      gpusched submit --name sweep-1 --team nlp --gpus 2 -- python train.py --lr 3e-4
      gpusched submit --name eval --gpus 1 --after job-1f3a9c -- python eval.py
    """
    overrides = _flag_fields(flags)
    docs = jobfile.load_docs(filename) if filename else [{}]
    if not filename and "name" not in overrides:
        raise click.UsageError("give a job file (-f) or at least --name")
    specs = [jobfile.parse(_merge(doc, overrides), where) for doc, where in jobfile.located(docs, filename)]
    if key and len(specs) > 1:
        raise click.UsageError("--key names one job; the file holds several")
    jobs = []
    for s in specs:   # each printed as it is accepted: a refusal later in a file leaves them standing
        r = client.submit(s, key or "")
        if output == "name":
            echo_lines([f"job/{r.job.job_id} {'submitted' if r.created else 'unchanged (the key named it)'}"])
        jobs.append(as_dict(r.job))
    if output != "name":
        dump(jobs, output)


# --- get -------------------------------------------------------------------------------
def _gpus(job: types_pb2.Job) -> str:
    per = gpus_of(job.spec.resources)
    return per if job.spec.workers == 1 else f"{job.spec.workers}x{per}"


def _nodes(job: types_pb2.Job) -> str:
    return ",".join(sorted({w.node for w in job.workers})) or "-"


def _phase(job: types_pb2.Job) -> str:
    """The phase; an array's with its tasks' progress (``running 12/50 (3 failed)``)."""
    a = job.array
    if not a.count:
        return phase_name(job.phase)
    return f"{phase_name(job.phase)} {a.ended}/{a.count}" + (f" ({a.failed} failed)" if a.failed else "")


JOB_COLUMNS = [("JOB ID", lambda j: j.job_id), ("NAME", lambda j: j.spec.name), ("TEAM", lambda j: j.spec.team),
               ("POOL", lambda j: j.spec.pool), ("PHASE", _phase), ("GPUS", _gpus),
               ("AGE", lambda j: age(j.submitted_at))]
JOB_WIDE = [("PRIORITY", lambda j: j.spec.priority_class), ("NODES", _nodes),
            ("RESTARTS", lambda j: str(j.restarts)), ("PREEMPTIONS", lambda j: str(j.preemptions)),
            ("REASON", lambda j: why(j))]


def _phases(names: tuple[str, ...], active: bool) -> tuple[int, ...]:
    phases = {types_pb2.JobPhase.Value("JOB_PHASE_" + n.upper()) for n in names}
    if active:
        phases |= {p for p in types_pb2.JobPhase.values() if p and p not in TERMINAL}
    return tuple(sorted(phases))


@click.group()
def get() -> None:
    """List jobs, nodes, queues, services or endpoints."""


@get.command("jobs")
@click.option("--team", default="")
@click.option("--pool", default="")
@click.option("--phase", multiple=True, type=click.Choice(PHASES), help="only these phases (repeat)")
@click.option("--active", is_flag=True, help="only jobs that have not ended")
@click.option("--expand", is_flag=True, help="an array's tasks too, each on a line of its own")
@output_option
@pass_client
def get_jobs(client: SyncClient, team: str, pool: str, phase: tuple[str, ...], active: bool, expand: bool,
             output: str) -> None:
    """Jobs, oldest first (``-o wide``: priority, nodes, restarts, reason); an array is one
    line, its tasks under it with ``--expand``."""
    jobs = sorted(client.list_all(team, pool, _phases(phase, active)),
                  key=lambda j: (seconds(j.submitted_at), j.array_of or j.job_id, j.array_of != "", j.array_index))
    table([j for j in jobs if expand or not j.array_of], JOB_COLUMNS, JOB_WIDE, output)


@get.command("queues")
@click.option("--pool", default="")
@output_option
@pass_client
def get_queues(client: SyncClient, pool: str, output: str) -> None:
    """Per pool and team: jobs pending and running, and their GPUs."""
    phases = tuple(p for p in types_pb2.JobPhase.values() if p and p not in TERMINAL)
    rows: dict[tuple[str, str], dict] = defaultdict(lambda: {"pending": 0, "running": 0, "pending_gpus": 0.0,
                                                             "running_gpus": 0.0})
    for job in client.list_all("", pool, phases):
        if job.array.count:
            continue   # an array's GPUs are its tasks'
        row = rows[(job.spec.pool, job.spec.team)]
        state = "pending" if job.phase == types_pb2.JOB_PHASE_PENDING else "running"
        row[state] += 1
        row[f"{state}_gpus"] += job.spec.workers * milli_of(job.spec.resources) / 1000
    items = [{"pool": p, "team": t, **v} for (p, t), v in sorted(rows.items())]
    table(items, [("POOL", lambda r: r["pool"]), ("TEAM", lambda r: r["team"]),
                  ("PENDING", lambda r: str(r["pending"])), ("PENDING GPUS", lambda r: gpu_count(r['pending_gpus'])),
                  ("RUNNING", lambda r: str(r["running"])), ("RUNNING GPUS", lambda r: gpu_count(r['running_gpus']))],
          fmt=output, objects=lambda r: r)


# --- describe ----------------------------------------------------------------------------
@click.group()
def describe() -> None:
    """One job, node or service in detail."""


def job_lines(job: types_pb2.Job) -> list[str]:
    s, r = job.spec, job.spec.resources
    lines = [f"Job:          {job.job_id}", f"Name:         {s.name}", f"Team:         {s.team}"
             + (f" (org {s.org})" if s.org else ""),
             f"Pool:         {s.pool}", f"Priority:     {s.priority_class}",
             f"Kind:         {types_pb2.JobKind.Name(s.kind).removeprefix('JOB_KIND_').lower()}",
             f"Preemptible:  {'yes' if s.preemptible else 'no'}",
             f"Workers:      {s.workers}" + (" (a gang: all or nothing)" if s.workers > 1 else ""),
             f"Per worker:   GPUs {gpus_of(r)}, CPU {r.cpu_milli}m, memory {r.memory_mib} MiB"
             + (f", models {', '.join(r.gpu_models)}" if r.gpu_models else "")
             + (f", GPU memory {r.gpu_memory_mib} MiB" if r.gpu_memory_mib else "")]
    if s.command:
        lines.append(f"Command:      {' '.join(s.command)}")
    if s.HasField("topology"):
        lines.append(f"Topology:     {topology_text(s.topology)}")
    lines += [f"Phase:        {phase_name(job.phase)}", f"Reason:       {job.reason or '-'}"]
    lines += pending_lines(job)
    lines.append(f"Attempt:      {job.attempt}  (restarts {job.restarts}, preemptions {job.preemptions})")
    if s.retry:
        lines.append("Retry:        " + "; ".join(retry_rule_text(r) for r in s.retry))
    if s.depends_on:
        lines.append("Depends on:   " + ", ".join(
            f"{d.job} ({types_pb2.DependencyCondition.Name(d.when).removeprefix('DEPENDENCY_CONDITION_').lower()})"
            for d in s.depends_on))
    if job.array.count:
        a = job.array
        lines.append(f"Array:        {a.count} tasks, {s.array.parallel or a.count} at a time: {a.ended} ended"
                     f" ({a.failed} not succeeded), {a.running} queued or running")
    if job.array_of:
        lines.append(f"Array task:   index {job.array_index} of {job.array_of}")
    if seconds(job.time_limit):
        lines.append(f"Time limit:   {seconds(job.time_limit):g}s")
    if job.checkpoint:
        lines.append(f"Checkpoint:   {job.checkpoint}")
    if job.idempotency_key:
        lines.append(f"Key:          {job.idempotency_key}")
    lines.append("Timeline:")
    for label, t in (("submitted", job.submitted_at), ("placed", job.placed_at), ("started", job.started_at),
                     ("ended", job.ended_at)):
        if seconds(t):
            lines.append(f"  {label:<10} {clock(t)}  ({age(t)} ago)")
    if job.workers:
        lines.append("Workers:")
        for w in job.workers:
            slots = ", ".join(f"{g.index}" + (f" ({g.milli}m)" if g.milli and g.milli < 1000 else "")
                              + (f" ({g.mig_profile})" if g.mig_profile else "") for g in w.gpus)
            lines.append(f"  {w.worker:<3} {w.node}  GPUs {slots or '-'}")
    if job.failures:
        lines.append("Attempts that failed:")
        for f in job.failures:
            cause = types_pb2.FailureCause.Name(f.cause).removeprefix("FAILURE_CAUSE_").lower()
            code = f" {f.exit_code}" if f.exit_code else ""
            lines.append(f"  {f.attempt:<3} {clock(f.time)}  {cause}{code:<5} "
                         f"{'counted' if f.counted else 'not counted':<11}  {f.reason}")
    return lines


def topology_text(t: types_pb2.TopologyRequest) -> str:
    """``required rack, preferred block, slices of 4 workers per block``; "-" when empty."""
    parts = [f"required {t.required}" if t.required else "", f"preferred {t.preferred}" if t.preferred else "",
             f"slices of {t.slice.workers} workers per {t.slice.level}" if t.slice.level or t.slice.workers else ""]
    return ", ".join(p for p in parts if p) or "-"


def retry_rule_text(rule: types_pb2.RetryRule) -> str:
    """``exit 2 -> fail``, ``oom -> count (2)``: one rule of a retry policy in words."""
    cause = types_pb2.FailureCause.Name(rule.cause).removeprefix("FAILURE_CAUSE_").lower()
    codes = f" {','.join(map(str, rule.exit_codes))}" if rule.exit_codes else ""
    action = types_pb2.RetryAction.Name(rule.action).removeprefix("RETRY_ACTION_").lower()
    return f"{cause}{codes} -> {action}" + (f" ({rule.max_restarts})" if rule.max_restarts else "")


def pending_lines(job: types_pb2.Job) -> list[str]:
    """Why a pending job waits, as the placer last found it (docs/guide/why-pending.md)."""
    if job.phase != types_pb2.JOB_PHASE_PENDING or not job.HasField("pending"):
        return []
    at = job.pending_at.ToNanoseconds() / 1e9
    kind = types_pb2.PendingKind.Name(job.pending.kind).removeprefix("PENDING_KIND_").lower()
    return [f"Why pending:  {job.pending.summary}", f"              ({kind}, found {clock(at)}, {age(at)} ago)"]


def why(job: types_pb2.Job, none: str = "-") -> str:
    """A line's reason: why a pending job waits where the placer said, else the job's reason."""
    if job.phase == types_pb2.JOB_PHASE_PENDING and job.HasField("pending"):
        return job.pending.summary
    return job.reason or none


@describe.command("job")
@click.argument("job_id")
@click.option("-o", "--output", type=click.Choice(["text", "json", "yaml"]), default="text")
@pass_client
def describe_job(client: SyncClient, job_id: str, output: str) -> None:
    """A job: its spec, phase and reason (why it waits, why it ended), timeline, workers."""
    job = client.get(job_id)
    if output != "text":
        dump(as_dict(job), output)
        return
    echo_lines(job_lines(job))


# --- cancel, watch -----------------------------------------------------------------------
@click.command()
@click.argument("job_ids", nargs=-1, required=True)
@click.option("--reason", default="", help="recorded with the cancellation")
@pass_client
def cancel(client: SyncClient, job_ids: tuple[str, ...], reason: str) -> None:
    """Cancel jobs; each is printed with its phase after the call."""
    for job_id in job_ids:
        job = client.cancel(job_id, reason)
        echo_lines([f"job/{job.job_id} {phase_name(job.phase).lower()}"])


@click.command()
@click.argument("job_ids", nargs=-1)
@click.option("--team", default="")
@click.option("--pool", default="")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text",
              help="text: a line per change; json: one JobUpdate object per line")
@pass_client
def watch(client: SyncClient, job_ids: tuple[str, ...], team: str, pool: str, output: str) -> None:
    """Follow job changes: each job's current state, then every change. With JOB_IDS it
    stops when all of them have ended (exit status 1 if any did not succeed); without,
    it follows until interrupted."""
    import json

    left = set(job_ids)
    failed = False
    job_filter = job_ids[0] if len(job_ids) == 1 else ""
    for update in client.watch(team, job_filter, pool):
        job = update.job
        if left and job.job_id not in left:
            continue
        if output == "json":
            click.echo(json.dumps(as_dict(update)))
        else:
            echo_lines([f"{time.strftime('%H:%M:%S')}  {job.job_id}  {job.spec.name:<20} "
                        f"{phase_name(job.phase):<11} {update.event_type or '-':<16} {why(job, none='')}".rstrip()])
        if left and job.phase in TERMINAL:
            left.discard(job.job_id)
            failed |= job.phase != types_pb2.JOB_PHASE_SUCCEEDED
            if not left:
                break
    if failed:
        raise SystemExit(1)
