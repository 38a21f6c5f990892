"""CPU per job of each daemon for bench/peer_slurm.py: a process's CPU with that of its
live descendants, read from /proc."""
from __future__ import annotations

import os
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(*pids: int, others: frozenset[int] = frozenset()) -> float:
    """CPU so far of processes and of all their live descendants (a node-agent's shims,
    which live through their workers' runs; a slurmd's slurmsteps in flight), each with
    that of the children it has reaped (the jobs); every process counted once, one gone
    counts 0, and the subtrees of ``others`` (counted on their own: the services this
    process started) left out. A child reaped between two readings moves from its own
    figure into its parent's, so a difference of two readings counts it once."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    seen: set[int] = set()
    stack, total = list(pids), 0
    while stack:
        pid = stack.pop()
        if pid in seen or pid not in table or (pid in others and pid not in pids):
            continue
        seen.add(pid)
        total += table[pid][1]
        stack.extend(children.get(pid, ()))
    return total / _TICK


def _proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, CPU ticks: its own and its reaped children's) of every process."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue   # gone meanwhile
        table[int(name)] = (int(fields[1]), sum(int(f) for f in fields[11:15]))
    return table
