"""One run of the rig under the nemesis, shared by tests/integration/test_network_faults.py
and bench/network_faults.py: short checkpointing jobs (real processes under the recorder,
one GPU each) submitted at a steady pace while faults come and go; then, once every fault
is healed, the wait for each acknowledged job's end and the checker's report."""
from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

from gpusched.client import spec
from gpusched.v1 import types_pb2
from tests.integration.logcheck import read_log
from tests.polling import eventually_async
from tests.rig.checker import Report, check
from tests.rig.nemesis import KINDS, Nemesis
from tests.rig.rig import RECORDER, Rig

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT"}


def phase_name(phase: int) -> str:
    return types_pb2.JobPhase.Name(phase).removeprefix("JOB_PHASE_")


async def submit_all(rig: Rig, jobs: int, every: float, duration: float, acked: set[str], log=print) -> None:
    """``jobs`` submissions, one each ``every`` seconds; each retried with its idempotency
    key until acknowledged (admission may be down or cut off), given up after 60 s."""
    async def one(n: int) -> None:
        key = f"rig-{n}"
        job = spec(f"job-{n}", "team-a", gpus=1, checkpoint_interval=0.5,
                   command=(*RECORDER, "--duration", str(duration), "--checkpoint-every", "0.5"))
        deadline = time.monotonic() + 60
        while True:
            try:
                acked.add((await asyncio.wait_for(rig.client.submit(job, key), 10)).job.job_id)
                return
            except Exception as exc:   # noqa: BLE001 - unacknowledged: retried, then counted as not acked
                if time.monotonic() > deadline:
                    log(f"submission {n} never acknowledged: {exc!r}")
                    return
                await asyncio.sleep(1.0)
    tasks = []
    for n in range(jobs):
        tasks.append(asyncio.create_task(one(n)))
        await asyncio.sleep(every)
    await asyncio.gather(*tasks)


async def final_states(rig: Rig, ids: set[str], timeout: float) -> dict[str, str]:
    """Every job's phase once all of ``ids`` have ended (or at the timeout)."""
    seen: dict[str, str] = {}

    async def ended():
        try:
            jobs = await asyncio.wait_for(rig.ops.list_all(), 15)
        except Exception:   # noqa: BLE001 - admission may still be catching up
            return False
        seen.clear()
        seen.update({j.job_id: phase_name(j.phase) for j in jobs})
        return all(seen.get(i) in TERMINAL for i in ids)
    try:
        await eventually_async(ended, "every acknowledged job ended", timeout, poll=1.0)
    except AssertionError:
        pass   # the checker reports what did not end
    return dict(seen)


async def run_under_faults(root: Path, seconds: float, *, jobs: int, agents: int = 5, seed: int = 1,
                           kinds: tuple[str, ...] = KINDS, duration: float = 3.0,
                           hold: tuple[float, float] = (4.0, 8.0), gap: tuple[float, float] = (3.0, 6.0),
                           settle: float = 180.0, at_once: int = 1, gpus: int = 1, log=print) -> Report:
    rng = random.Random(seed)
    acked: set[str] = set()
    t0 = time.monotonic()
    async with Rig(root, agents=agents, gpus=gpus) as rig:
        log(f"rig up ({agents} agents of {gpus} GPU(s), brokers {rig.bootstrap}, network tag {rig.net.tag}) "
            f"in {time.monotonic() - t0:.0f}s; faults for {seconds:.0f}s, seed {seed}")
        nemesis = Nemesis(rig, rng, kinds)
        every = max(0.05, (seconds - 5) / max(1, jobs))
        submitting = asyncio.create_task(submit_all(rig, jobs, every, duration, acked, log))
        try:
            await nemesis.run(seconds, hold, gap, at_once=at_once)
            await submitting
        finally:
            submitting.cancel()
            await nemesis.heal_all()
        log(f"faults over after {time.monotonic() - t0:.0f}s; waiting for {len(acked)} jobs")
        final = await final_states(rig, acked, settle)
        log(f"settled after {time.monotonic() - t0:.0f}s")
        for f in nemesis.faults:
            log(f"  fault at {time.strftime('%H:%M:%S', time.localtime(f.start))}: {f}")
        events = await read_log(rig.bootstrap, rig.topics)
        snapshots = await read_log(rig.bootstrap, rig.topics, rig.topics.snapshots)
        return check(acked, final, rig.state_root, events, nemesis.faults, snapshots)
