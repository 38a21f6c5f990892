"""``gpusched <command>``: one entry point for the services, the demo and the simulator."""
from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "admission": ("gpusched_admission.main", "the job API (gRPC) in front of the pool logs"),
    "placer": ("gpusched_placer.main", "schedules the pools it owns"),
    "preemptor": ("gpusched_preemptor.main", "preemption, quota reclaim, node-loss detection"),
    "node-agent": ("gpusched_node_agent.main", "runs the work of one node (NVML or simulated)"),
    "billing": ("gpusched.consumers.billing", "GPU-hours per team, folded from the log"),
    "usage": ("gpusched.consumers.usage_report", "GPU-hours allocated vs used (measured), idle jobs"),
    "policy": ("gpusched.policy_cli", "read and set quotas, weights and allow-lists (docs/policy.md)"),
    "kafka-setup": ("gpusched.kafka_setup", "create a deployment's topics and ACLs (as the Kafka admin)"),
    "relay": ("gpusched.relay", "node-agents' reports into the pool log (admission runs one too)"),
    "demo": ("gpusched.demo", "a local cluster, a mixed workload, and what happened"),
    "simulate": ("gpusched.sim.cli", "trace-driven simulator: `simulate static|dynamic ...`"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: gpusched <command> [args]\n\ncommands:")
        for name, (_, help_text) in COMMANDS.items():
            print(f"  {name:<11} {help_text}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(COMMANDS[argv[0]][0])
    result = module.main(argv[1:])
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
