"""Node commands: get nodes, describe node, cordon, uncordon, top nodes|teams."""
from __future__ import annotations

from collections import defaultdict

import click

from gpusched.client import SyncClient
from gpusched.ctl.jobs import HOLDING, describe, get
from gpusched.ctl.output import (as_dict, dump, echo_lines, gpu_count, milli_of, node_status, output_option,
                                 table)
from gpusched.ctl.root import pass_client
from gpusched.v1 import types_pb2


def _allocated(node: types_pb2.Node) -> float:
    """GPUs allocated on ``node`` as the API counts them (``Gpu.allocated_milli``: a MIG
    slice its compute sevenths, as a job's usage)."""
    return sum(g.allocated_milli for g in node.gpus) / 1000


def _alloc(node: types_pb2.Node) -> str:
    return f"{gpu_count(_allocated(node))}/{len(node.gpus)}"


def _models(node: types_pb2.Node) -> str:
    return ",".join(sorted({g.info.model for g in node.gpus})) or "-"


def _status(node: types_pb2.Node) -> str:
    faulty = sum(1 for g in node.gpus if not g.healthy)
    return node_status(node.status) + (f" ({faulty} GPU faulty)" if faulty else "")


def _pct(used: float, total: float) -> str:
    return f"{used / total:.0%}" if total else "-"


NODE_COLUMNS = [("NAME", lambda n: n.info.name), ("POOL", lambda n: n.info.pool), ("STATUS", _status),
                ("GPUS", _alloc), ("MODEL", _models), ("JOBS", lambda n: str(len(n.jobs)))]
NODE_WIDE = [("CPU", lambda n: f"{n.used_cpu_milli}m/{n.info.cpu_milli}m"),
             ("MEMORY", lambda n: f"{n.used_memory_mib}/{n.info.memory_mib} MiB"),
             ("LABELS", lambda n: ",".join(f"{k}={v}" for k, v in sorted(n.info.labels.items())) or "-"),
             ("SIMULATED", lambda n: "yes" if n.info.simulated else "no")]


@get.command("nodes")
@click.option("--pool", default="")
@output_option
@pass_client
def get_nodes(client: SyncClient, pool: str, output: str) -> None:
    """Nodes with their GPUs allocated / present (``-o wide``: CPU, memory, labels)."""
    table(sorted(client.nodes(pool), key=lambda n: n.info.name), NODE_COLUMNS, NODE_WIDE, output)


@describe.command("node")
@click.argument("name")
@click.option("-o", "--output", type=click.Choice(["text", "json", "yaml"]), default="text")
@pass_client
def describe_node(client: SyncClient, name: str, output: str) -> None:
    """A node: status, resources, each GPU (whole, shares, MIG slices, health), its jobs."""
    node = client.node(name)
    if output != "text":
        dump(as_dict(node), output)
        return
    i = node.info
    lines = [f"Node:       {i.name}", f"Pool:       {i.pool}", f"Status:     {_status(node)}",
             f"Labels:     {', '.join(f'{k}={v}' for k, v in sorted(i.labels.items())) or '-'}",
             f"CPU:        {node.used_cpu_milli}m of {i.cpu_milli}m", f"Memory:     {node.used_memory_mib} of "
             f"{i.memory_mib} MiB", f"Agent:      {i.agent_id or '-'}{' (simulated)' if i.simulated else ''}",
             "GPUs:"]
    for g in node.gpus:
        mig = f", MIG slices {bin(g.mig_slices_used).count('1')}/8 used" if g.mig_slices_used else ""
        lines.append(f"  {g.info.index:<3} {g.info.model:<14} {'healthy' if g.healthy else 'FAULTY':<8} "
                     f"allocated {gpu_count(g.allocated_milli / 1000)}{mig}")
    lines.append(f"Jobs:       {', '.join(node.jobs) or '-'}")
    echo_lines(lines)


@click.command()
@click.argument("name")
@click.option("--reason", default="", help="recorded with the cordon")
@pass_client
def cordon(client: SyncClient, name: str, reason: str) -> None:
    """Place no new work on a node (its running jobs go on)."""
    echo_lines([f"node/{name} {node_status(client.cordon(name, reason).status).lower()}"])


@click.command()
@click.argument("name")
@pass_client
def uncordon(client: SyncClient, name: str) -> None:
    """Let work be placed on a node again (clears a quarantine too)."""
    echo_lines([f"node/{name} {node_status(client.uncordon(name).status).lower()}"])


@click.group()
def top() -> None:
    """GPU allocation now, per node, team or service."""


@top.command("nodes")
@click.option("--pool", default="")
@output_option
@pass_client
def top_nodes(client: SyncClient, pool: str, output: str) -> None:
    """Per node: GPUs, CPU and memory allocated, as shares of what it has."""
    rows = []
    for n in sorted(client.nodes(pool), key=lambda n: n.info.name):
        gpus = _allocated(n)
        rows.append({"node": n.info.name, "pool": n.info.pool, "status": node_status(n.status).lower(),
                     "gpus_allocated": gpus, "gpus": len(n.gpus),
                     "cpu_allocated": n.used_cpu_milli / 1000, "cpu": n.info.cpu_milli / 1000,
                     "memory_allocated_mib": n.used_memory_mib, "memory_mib": n.info.memory_mib,
                     "jobs": len(n.jobs)})
    table(rows, [("NODE", lambda r: r["node"]), ("POOL", lambda r: r["pool"]),
                 ("GPUS", lambda r: f"{gpu_count(r['gpus_allocated'])}/{r['gpus']}"),
                 ("GPU%", lambda r: _pct(r["gpus_allocated"], r["gpus"])),
                 ("CPU%", lambda r: _pct(r["cpu_allocated"], r["cpu"])),
                 ("MEM%", lambda r: _pct(r["memory_allocated_mib"], r["memory_mib"])),
                 ("JOBS", lambda r: str(r["jobs"]))],
          [("STATUS", lambda r: r["status"])], output, objects=lambda r: r)


@top.command("teams")
@click.option("--pool", default="")
@click.option("--measured", is_flag=True,
              help="add GPU-hours allocated vs used as the nodes measured them (reads the usage topic "
                   "from Kafka, as `gpusched usage`: KAFKA_BOOTSTRAP_SERVERS, GPUSCHED_TOPIC_PREFIX, ...)")
@output_option
@pass_client
def top_teams(client: SyncClient, pool: str, measured: bool, output: str) -> None:
    """Per team: GPUs held now and waited for, against its quota."""
    rows: dict[str, dict] = defaultdict(lambda: {"running": 0, "pending": 0, "gpus_allocated": 0.0,
                                                 "gpus_pending": 0.0})
    for job in client.list_all("", pool, tuple(HOLDING | {types_pb2.JOB_PHASE_PENDING})):
        row = rows[job.spec.team]
        gpus = job.spec.workers * milli_of(job.spec.resources) / 1000
        if job.phase == types_pb2.JOB_PHASE_PENDING:
            row["pending"] += 1
            row["gpus_pending"] += gpus
        else:
            row["running"] += 1
            row["gpus_allocated"] += gpus
    quotas = {q.team: q for q in client.policy().quotas if q.team}
    for team, q in quotas.items():
        if team != "*":
            rows[team]["guaranteed_gpus"] = q.guaranteed_gpus
            rows[team]["limit_gpus"] = q.limit_gpus
    columns = [("TEAM", lambda r: r["team"]), ("RUNNING", lambda r: str(r["running"])),
               ("GPUS", lambda r: gpu_count(r['gpus_allocated'])), ("PENDING", lambda r: str(r["pending"])),
               ("GPUS WAITING", lambda r: gpu_count(r['gpus_pending'])),
               ("GUARANTEED", lambda r: f"{r['guaranteed_gpus']:g}" if "guaranteed_gpus" in r else "-"),
               ("LIMIT", lambda r: "-" if r.get("limit_gpus", -1) < 0 else f"{r['limit_gpus']:g}")]
    if measured:
        for team, hours in _measured(pool).items():
            rows[team].update(hours)
        columns += [("GPU-H ALLOCATED", lambda r: f"{r.get('gpu_hours_allocated', 0):.4f}"),
                    ("GPU-H USED", lambda r: f"{r.get('gpu_hours_used', 0):.4f}"),
                    ("UTIL", lambda r: "-" if r.get("utilization") is None else f"{r['utilization']:.0%}")]
    items = [{"team": t, **v} for t, v in sorted(rows.items())]
    table(items, columns, fmt=output, objects=lambda r: r)


def _measured(pool: str) -> dict[str, dict]:
    """GPU-hours per team from the pool log and the agents' usage records (docs/guide/utilization.md)."""
    import argparse
    import asyncio
    import time

    from gpusched.adapters.broker.kafka_admin import TopicNames
    from gpusched.adapters.broker.kafka_security import KafkaConnection
    from gpusched.config import KafkaSettings, kafka_settings
    from gpusched.consumers.usage_report import collect
    from gpusched.consumers.utilization import GpuHours, UtilizationLedger

    parser = argparse.ArgumentParser()
    KafkaSettings.add_args(parser)
    settings = kafka_settings(parser.parse_args([]))
    ledger = UtilizationLedger()
    asyncio.run(collect(KafkaConnection.from_settings(settings), TopicNames(settings.topic_prefix), ledger))
    report = ledger.report(now=time.time())
    teams: dict[str, GpuHours] = {}
    for job in report.jobs.values():
        if not pool or job.pool == pool:
            teams[job.team] = teams.get(job.team, GpuHours()) + job.hours
    return {team: {"gpu_hours_allocated": h.allocated, "gpu_hours_used": h.used, "utilization": h.utilization,
                   "simulated": h.simulated} for team, h in teams.items()}
