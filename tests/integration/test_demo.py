"""``gpusched demo --serve`` as the README's tour uses it, on the test broker: its cluster
runs a preemptor, so best-effort work filling every GPU gives way to a production job
(one preemption, as the tour shows), and at the end no topic of the demo is left, the
nodes' report, beats and work-view topics included."""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys

from aiokafka.admin import AIOKafkaAdminClient

from gpusched.adapters.broker.kafka_security import client_args
from tests.integration.cli_runs import Cli, first_running

NODES = 2


async def _line(stream, pattern: str, seen: list[str], timeout: float = 300.0) -> re.Match:
    """The demo's first output line matching ``pattern`` (lines read meanwhile go to ``seen``)."""
    while True:
        line = (await asyncio.wait_for(stream.readline(), timeout)).decode()
        assert line, "the demo ended early:\n" + "".join(seen)
        seen.append(line)
        if match := re.search(pattern, line):
            return match


async def test_the_tour_shows_a_preemption_and_the_demo_leaves_no_topic(kafka_bootstrap, tmp_path):
    demo = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpusched.cli", "demo", "--serve", "--nodes", str(NODES), "--jobs", "8",
        "--usage-interval", "0", "--min-duration", "0.2", "--max-duration", "0.5",
        env={**os.environ, **kafka_bootstrap.env(), "PYTHONUNBUFFERED": "1"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    seen: list[str] = []
    try:
        prefix = (await _line(demo.stdout, r"topics (\S+)\*;", seen))[1]
        assert "preemptor" in (await _line(demo.stdout, r"^cluster up:.*", seen))[0]
        port = int((await _line(demo.stdout, r"export GPUSCHED_ENDPOINT=127\.0\.0\.1:(\d+)", seen))[1])
        cli = Cli(port, tmp_path)

        # the tour: best-effort work fills every GPU, then something that matters more comes
        fillers = []
        for i in range(NODES):
            out = await cli.run("submit", "--name", f"scavenger-{i}", "--team", "vision", "--priority", "best-effort",
                                "--gpus", "8", "--duration", "600")
            fillers.append(out.split()[0].removeprefix("job/"))
        for job in fillers:
            assert await first_running(cli, job) == job
        out = await cli.run("submit", "--name", "urgent", "--team", "search", "--priority", "production-inference",
                            "--gpus", "8", "--duration", "600")
        urgent = out.split()[0].removeprefix("job/")
        assert await first_running(cli, urgent) == urgent   # only once a scavenger made room
        jobs = {j["job_id"]: j for j in json.loads(await cli.run("get", "jobs", "-o", "json"))}
        preempted = [jobs[f] for f in fillers if jobs[f]["preemptions"] == 1]
        assert len(preempted) == 1, [(jobs[f]["phase"], jobs[f]["reason"]) for f in fillers]
        assert preempted[0]["phase"] == "JOB_PHASE_PENDING" and urgent in preempted[0]["reason"]
    finally:
        if demo.returncode is None:
            demo.send_signal(signal.SIGINT)   # the tour's end: Ctrl-C in the demo's shell
        rest, _ = await asyncio.wait_for(demo.communicate(), 180)
        seen.append(rest.decode())
    assert demo.returncode == 0, "".join(seen)[-3000:]
    assert f"topics {prefix}* deleted" in seen[-1], seen[-1]
    admin = AIOKafkaAdminClient(**client_args(kafka_bootstrap))
    await admin.start()
    try:
        left = [t for t in await admin.list_topics() if t.startswith(prefix)]
    finally:
        await admin.close()
    assert left == [], left
