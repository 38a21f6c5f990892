"""Benchmark: what launching one worker costs the node, through ``ProcessRun``.

N launches of ``true`` (C in flight), each started and waited for to its end as the agent
does, side by side in one run:

* ``native``: the compiled shim (``shim.c``) spawned by the agent, as the node-agent
  runs workers where deploy/setup.sh built it (``native_shim``).
* ``launcher``: the Python shim forked by the agent's launcher (``launcher.py``), as the
  node-agent runs workers where the compiled shim is not built; the launcher is started
  for the round and closed at its end, so its own start counts too.
* ``interpreter``: the shim started as a new interpreter per launch
  (``python -S shim.py ...``), as the node-agent did before the launcher.

CPU per launch: this process (the agent's side) and its reaped descendants (launcher,
shims, workloads), from ``getrusage``; wall per launch besides, and the descendants' minor
page faults per launch (a forked shim's copy-on-write pages, the launcher's after each fork).

    .venv/bin/python bench/launch_bench.py [--launches 300 --concurrency 8 --rounds 3]
"""
from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gpusched_node_agent import launcher, native_shim
from gpusched_node_agent.runner import SHIM, ProcessRun


class _InterpreterShim:
    """An ``asyncio`` child process with the launcher's ``ShimProcess`` interface."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc, self.pid = proc, proc.pid
        self.written = asyncio.get_running_loop().create_future()   # no launcher tells: never done

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    @property
    def ended(self) -> bool:
        return self.proc.returncode is not None

    def wait(self):
        return self.proc.wait()

    def send_signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        self.proc.kill()


class LauncherRun(ProcessRun):
    """The Python shim forked by the launcher."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.native = False


class NativeRun(ProcessRun):
    """The compiled shim spawned by the agent."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.native = True


class InterpreterRun(LauncherRun):
    """The shim started as a new interpreter per launch (the path the launcher replaced),
    whose status file the agent polled every 10 ms."""

    START_POLL_S = 0.01

    async def _launch_shim(self):
        self.workdir.mkdir(parents=True, exist_ok=True)   # the launcher's part, done here
        return _InterpreterShim(await asyncio.create_subprocess_exec(
            sys.executable, "-S", str(SHIM), *self.shim_args(), env=self.env, cwd=self.workdir,
            start_new_session=True))


def cpu() -> tuple[float, float, int]:
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, children.ru_utime + children.ru_stime, children.ru_minflt


async def round_of(kind: type[ProcessRun], launches: int, concurrency: int, root: Path) -> dict:
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with gate:
            run = kind(("true",), {}, root / f"{kind.__name__}-{i}", kill_wait=1.0)
            await run.start()
            end = await run.wait()
            if end.exit_code != 0:
                raise RuntimeError(f"launch {i}: {end}")

    (me0, kids0, faults0), wall0 = cpu(), time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(launches)))
    if kind is LauncherRun:   # let the launcher go and reap it, so its CPU (and its shims') is counted
        current = launcher._current
        launcher.close()
        await current.process.wait()
    (me1, kids1, faults1), wall1 = cpu(), time.perf_counter()
    return {"agent_ms": (me1 - me0) * 1e3 / launches, "children_ms": (kids1 - kids0) * 1e3 / launches,
            "wall_ms": (wall1 - wall0) * 1e3 / launches, "faults": (faults1 - faults0) / launches}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    paths = [("interpreter", InterpreterRun), ("launcher", LauncherRun)]
    if native_shim.available():
        paths.append(("native", NativeRun))
    else:
        print("the compiled shim is not built (deploy/setup.sh): no native row", file=sys.stderr)
    results: dict[str, list[dict]] = {name: [] for name, _ in paths}
    with tempfile.TemporaryDirectory(prefix="launch-bench-") as tmp:
        for r in range(args.rounds):
            for name, kind in paths:
                results[name].append(await round_of(kind, args.launches, args.concurrency, Path(tmp) / f"r{r}"))
    print(f"{args.launches} launches of `true`, {args.concurrency} in flight, median of {args.rounds} rounds")
    print(f"{'path':<12} {'agent CPU':>10} {'launcher+shims CPU':>19} {'total CPU':>10} {'wall':>8}  (ms per launch)"
          f" {'faults':>7}")
    totals = {}
    for name, rounds in results.items():
        agent = statistics.median(r["agent_ms"] for r in rounds)
        kids = statistics.median(r["children_ms"] for r in rounds)
        totals[name] = statistics.median(r["agent_ms"] + r["children_ms"] for r in rounds)
        wall = statistics.median(r["wall_ms"] for r in rounds)
        faults = statistics.median(r["faults"] for r in rounds)
        print(f"{name:<12} {agent:>10.2f} {kids:>19.2f} {totals[name]:>10.2f} {wall:>8.2f} {faults:>24.0f}")
    print(f"total CPU per launch, interpreter / launcher: {totals['interpreter'] / totals['launcher']:.2f}x")
    if "native" in totals:
        print(f"total CPU per launch, native / launcher: {totals['native'] / totals['launcher']:.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
