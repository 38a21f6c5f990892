"""The services and tools: which module runs each, and which extra of the package it needs.

The base install is the client and the ``gpusched`` command; each role adds an extra
(pyproject.toml): ``server``, ``agent``, ``accounting``, ``dashboard``, ``sim``. A command
is imported only when it runs, and one whose extra is not installed stops with one line
naming the extra to install, never a traceback (``run``). Used by ``gpusched <command>``
(gpusched.cli) and by the console scripts (``gpusched-admission``, ...).
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    target: str          # "module" (runs its main) or "module:function", called with the arguments
    help: str
    extra: str           # the package extra that brings what it imports


COMMANDS = {
    "admission": Command("gpusched_admission.main", "the job API (gRPC) in front of the pool logs", "server"),
    "placer": Command("gpusched_placer.main", "schedules the pools it owns", "server"),
    "preemptor": Command("gpusched_preemptor.main", "preemption, quota reclaim, node-loss detection", "server"),
    "relay": Command("gpusched.relay", "node-agents' reports into the pool log (admission runs one too)", "server"),
    "kafka-setup": Command("gpusched.kafka_setup", "create a deployment's topics and ACLs (as the Kafka admin)",
                           "server"),
    "node-agent": Command("gpusched_node_agent.main", "runs the work of one node (NVML or simulated)", "agent"),
    "node-host": Command("gpusched_node_agent.host_main", "runs many simulated nodes in one process", "agent"),
    # audit and billing: docs/guide/audit-billing.md
    "billing": Command("gpusched.consumers.reports:billing_main", "GPU-hours per team, pool, job, day (from the "
                       "database)", "accounting"),
    "audit": Command("gpusched.consumers.reports:audit_main", "who did what, when (from the database)", "accounting"),
    "billing-consumer": Command("gpusched.consumers.stream:billing_main", "store GPU-hours in the database (faust)",
                                "accounting"),
    "audit-consumer": Command("gpusched.consumers.stream:audit_main", "store who did what in the database (faust)",
                              "accounting"),
    "usage": Command("gpusched.consumers.usage_report", "GPU-hours allocated vs used (measured), idle jobs",
                     "accounting"),
    "demo": Command("gpusched.demo", "a local cluster, a mixed workload, and what happened", "server,agent"),
    "simulate": Command("gpusched.sim.cli", "trace-driven simulator: `simulate static|dynamic ...`", "sim"),
}
OWN_MODULES = ("gpusched", "gpusched_admission", "gpusched_placer", "gpusched_preemptor", "gpusched_node_agent")


def missing_extra(command: str, exc: ModuleNotFoundError) -> str | None:
    """The one line for a module of another distribution not found while ``command`` ran;
    None when the module is one of this package's own (a broken install: the traceback
    tells more)."""
    top = (exc.name or "").split(".")[0]
    if not top or top in OWN_MODULES:
        return None
    extra = COMMANDS[command].extra
    return (f"gpusched {command} needs the package's [{extra}] extra (module {top!r} is not installed): "
            f"pip install 'gpusched[{extra}]'")


def run(command: str, argv: list[str] | None = None) -> int:
    """Run ``command`` with ``argv`` (default: this process's arguments); its exit code."""
    module_name, _, function = COMMANDS[command].target.partition(":")
    args = sys.argv[1:] if argv is None else argv
    try:
        result = getattr(importlib.import_module(module_name), function or "main")(args)
    except ModuleNotFoundError as exc:
        line = missing_extra(command, exc)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 1
    service = sys.modules.get("gpusched.adapters.service")   # loaded by every service, never imported here
    if service is not None and service.failure:   # it stopped itself (stop_failing): say why last
        print(service.failure, file=sys.stderr)
        return 1
    return result if isinstance(result, int) else 0


# The console scripts (pyproject.toml: [project.scripts]).
def admission() -> int:
    return run("admission")


def placer() -> int:
    return run("placer")


def preemptor() -> int:
    return run("preemptor")


def node_agent() -> int:
    return run("node-agent")


def node_host() -> int:
    return run("node-host")


def audit_consumer() -> int:
    return run("audit-consumer")


def billing_consumer() -> int:
    return run("billing-consumer")
