"""Pool commands: ``describe pool`` and ``pool topology`` (operators)."""
from __future__ import annotations

import click

from gpusched.client import SyncClient, seconds
from gpusched.ctl.jobs import describe
from gpusched.ctl.output import as_dict, dump, echo_lines, gpu_count
from gpusched.ctl.root import pass_client
from gpusched.v1 import cluster_pb2


def pool_lines(s: cluster_pb2.PoolSummary) -> list[str]:
    limits = [f"default {seconds(s.default_time_limit):g}s" if seconds(s.default_time_limit) else "",
              f"max {seconds(s.max_time_limit):g}s" if seconds(s.max_time_limit) else ""]
    return [f"Pool:         {s.pool}", f"Nodes:        {s.nodes}",
            f"GPUs:         {gpu_count(s.gpu_milli_allocated / 1000)}/{s.gpus} allocated",
            f"CPU:          {s.cpu_milli_allocated}m of {s.cpu_milli_capacity}m",
            f"Jobs:         {s.pending_jobs} pending, {s.running_jobs} running",
            f"Time limits:  {', '.join(p for p in limits if p) or '-'}",
            f"Topology:     {' > '.join(s.topology_levels) or '-'}"]


@describe.command("pool")
@click.argument("pool", default="default")
@click.option("-o", "--output", type=click.Choice(["text", "json", "yaml"]), default="text")
@pass_client
def describe_pool(client: SyncClient, pool: str, output: str) -> None:
    """A pool: nodes, GPUs allocated, jobs, time limits and topology levels."""
    summary = client.summary(pool)
    if output != "text":
        dump(as_dict(summary), output)
        return
    echo_lines(pool_lines(summary))


@click.group()
def pool() -> None:
    """Pool settings (operators)."""


@pool.command("topology")
@click.argument("name")
@click.option("--levels", required=True,
              help="node label keys from the top down, comma-separated (spine,rack,block); '': the default levels")
@pass_client
def pool_topology(client: SyncClient, name: str, levels: str) -> None:
    """Declare a pool's topology levels, the names a job's topology request uses
    (docs/guide/workloads.md, "Topology")."""
    summary = client.set_pool_topology(name, [level.strip() for level in levels.split(",") if level.strip()])
    echo_lines([f"pool/{summary.pool} topology {','.join(summary.topology_levels)}"])
