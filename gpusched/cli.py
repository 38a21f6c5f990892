"""``gpusched <command>``: the user and operator commands (gpusched.ctl, docs/cli.md) and
one entry point for the services, the demo and the simulator."""
from __future__ import annotations

import importlib
import sys

import click

from gpusched.ctl.decode import decode
from gpusched.ctl.jobs import cancel, describe, get, submit, watch
from gpusched.ctl.nodes import cordon, top, uncordon
from gpusched.ctl.policy import policy
from gpusched.ctl.root import Root, State, connection_options
from gpusched.dashboard.command import dashboard

# Commands with parsers of their own: their arguments are handed on as given.
COMMANDS = {
    "admission": ("gpusched_admission.main", "the job API (gRPC) in front of the pool logs"),
    "placer": ("gpusched_placer.main", "schedules the pools it owns"),
    "preemptor": ("gpusched_preemptor.main", "preemption, quota reclaim, node-loss detection"),
    "node-agent": ("gpusched_node_agent.main", "runs the work of one node (NVML or simulated)"),
    "node-host": ("gpusched_node_agent.host_main", "runs many simulated nodes in one process"),
    # audit and billing: docs/audit-billing.md ("module:function" where not ``main``)
    "billing": ("gpusched.consumers.reports:billing_main", "GPU-hours per team, pool, job, day (from the database)"),
    "audit": ("gpusched.consumers.reports:audit_main", "who did what, when (from the database)"),
    "billing-consumer": ("gpusched.consumers.stream:billing_main", "store GPU-hours in the database (faust)"),
    "audit-consumer": ("gpusched.consumers.stream:audit_main", "store who did what in the database (faust)"),
    "usage": ("gpusched.consumers.usage_report", "GPU-hours allocated vs used (measured), idle jobs"),
    "kafka-setup": ("gpusched.kafka_setup", "create a deployment's topics and ACLs (as the Kafka admin)"),
    "relay": ("gpusched.relay", "node-agents' reports into the pool log (admission runs one too)"),
    "demo": ("gpusched.demo", "a local cluster, a mixed workload, and what happened"),
    "simulate": ("gpusched.sim.cli", "trace-driven simulator: `simulate static|dynamic ...`"),
}


def _handed_on(name: str, module: str, help_text: str) -> click.Command:
    @click.command(name, help=f"{help_text} (`gpusched {name} --help`)", short_help=help_text,
                   add_help_option=False, context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def run(args: tuple[str, ...]) -> None:
        module_name, _, function = module.partition(":")
        result = getattr(importlib.import_module(module_name), function or "main")(list(args))
        sys.exit(result if isinstance(result, int) else 0)
    return run


@click.group(cls=Root, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@connection_options
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, context: str | None, **flags: str | None) -> None:
    """gpusched: an event-sourced GPU cluster scheduler. The API's endpoint and credentials
    come from the options, GPUSCHED_* variables, or the current context of
    ~/.config/gpusched/config.yaml (docs/cli.md)."""
    ctx.obj = State(flags, config_path, context)


for command in (submit, get, describe, cancel, watch, top, cordon, uncordon, policy, dashboard, decode):
    cli.add_command(command)
for name, (module, help_text) in COMMANDS.items():
    cli.add_command(_handed_on(name, module, help_text))
cli.services = frozenset(COMMANDS)


def main(argv: list[str] | None = None) -> int:
    return cli.main(args=argv, prog_name="gpusched", standalone_mode=True) or 0


if __name__ == "__main__":
    sys.exit(main())
