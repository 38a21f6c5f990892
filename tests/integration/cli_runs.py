"""Running the ``gpusched`` command as a process, as a user does, for the tests of the
commands and of the demo's tour: its output, its tables as rows, and a watch until a job
runs."""
from __future__ import annotations

import asyncio
import os
import re
import sys


class Cli:
    """Runs ``python -m gpusched.cli`` against one admission, with no config file."""

    def __init__(self, port: int, home) -> None:
        self.env = {**os.environ, "GPUSCHED_ENDPOINT": f"127.0.0.1:{port}",
                    "GPUSCHED_CONFIG": str(home / "no-config.yaml")}

    async def run(self, *args: str, ok: bool = True, timeout: float = 120.0, env: dict | None = None) -> str:
        code, out, err = await self.status(*args, timeout=timeout, env=env)
        assert (code == 0) == ok, f"gpusched {' '.join(args)} -> {code}\n{out}\n{err}"
        return out if ok else err

    async def status(self, *args: str, timeout: float = 120.0, env: dict | None = None) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "gpusched.cli", *args,
                                                    env={**self.env, **(env or {})},
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
        return proc.returncode, out.decode(), err.decode()


def rows(table: str) -> list[dict[str, str]]:
    """A printed table as dicts by header: columns start where the header's names do
    (a name may hold single spaces; columns are two or more apart)."""
    header, *lines = table.rstrip().splitlines()
    starts = [m.start() for m in re.finditer(r"\S+(?: \S+)*", header)]
    names = [header[a:b].strip() for a, b in zip(starts, starts[1:] + [None])]
    return [{n: line[a:b].strip() for n, a, b in zip(names, starts, starts[1:] + [None])} for line in lines]


async def first_running(cli: Cli, *job_ids: str) -> str:
    """The first of ``job_ids`` that ``gpusched watch`` shows running (awaited, not polled)."""
    watch = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpusched.cli", "watch", *job_ids, env=cli.env, stdout=asyncio.subprocess.PIPE)
    try:
        while True:
            line = (await asyncio.wait_for(watch.stdout.readline(), 60)).decode()
            assert line, "watch ended before any of the jobs ran"
            fields = line.split()   # time, job id, name, phase, event, reason
            if fields[1] in job_ids and fields[3] == "Running":
                return fields[1]
    finally:
        watch.terminate()
        await watch.wait()
