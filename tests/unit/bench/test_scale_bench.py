"""bench/scale_bench.py's report of the placer's cycles (``cycle_report``): exact
nearest-rank quantiles over the cycle log, the replica's first (cold) cycle apart from the
rest's p99, and the wall time the placer waited for a core (wall less CPU); ``--sim-nice``'s
renicing of every thread of the node hosts and the submitter only; the submit->placed times."""
from __future__ import annotations

import os
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))

_environ = dict(os.environ)
import scale_bench  # noqa: E402  (sets the admission limits it benchmarks without: undone below)
os.environ.clear()
os.environ.update(_environ)


def cycle(t: float, wall: float, cpu: float, placed: int = 300) -> dict[str, float]:
    return {"time": t, "partition": 0, "wall_ms": wall, "cpu_ms": cpu, "gc_ms": 0.0, "pending": 1000.0,
            "placed": float(placed), "reasons_ms": 1.0}


def test_the_first_cycle_is_reported_apart_from_the_p99_of_the_rest():
    cycles = [cycle(100.0, 900.0, 400.0)] + [cycle(100.0 + i, 60.0 + i, 30.0) for i in range(1, 100)]
    lines = scale_bench.cycle_report(cycles, longest=2).splitlines()
    assert lines[0].startswith("placer cycles: 100, wall ms mean 118, p50 111, p99 900, max 900; CPU ms p50 30, "
                               "p99 400;")
    # the 99 after it: walls 61..159, nearest-rank p99 the 98th (0-based): 159; waited: 500, then 31..129;
    # between cycles: 1 s apart less the next's wall and 1 ms pass: 938, 937 .. 840, p50 the 49th of 840..938
    assert lines[1] == ("  the first cycle (cold) wall 900 ms, CPU 400; the 99 after it: wall p99 159, CPU p99 30; "
                        "wall less CPU (the placer waiting for a core) p50 81 ms, p99 500; between cycles (the "
                        "append, its round trip through the log, rest) p50 889 ms, p99 938")
    assert lines[2].startswith("  at +0.0s: wall 900 ms, CPU 400")
    assert lines[3].startswith("  at +99.0s: wall 159 ms")
    assert len(lines) == 4


def test_one_cycle_has_no_rest_to_report_apart():
    lines = scale_bench.cycle_report([cycle(5.0, 70.0, 35.0)]).splitlines()
    assert len(lines) == 2 and lines[1].startswith("  at +0.0s: wall 70 ms")


def test_no_cycles():
    assert scale_bench.cycle_report([]) == "placer cycles: none logged"


# --sim-nice: every thread of the processes that stand for other machines, and only theirs.
import subprocess  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import pytest  # noqa: E402
import scale_processes  # noqa: E402

# A process with a second thread already running when it is reniced (as gRPC's and Kafka's are).
CHILD = ("import sys, threading; done = threading.Event(); threading.Thread(target=done.wait).start(); "
         "print('ready', flush=True); sys.stdin.read(); done.set()")


class Child:
    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout.readline() == "ready\n"
        return self.proc

    def __exit__(self, *exc):
        self.proc.stdin.close()
        self.proc.wait()


def test_renice_reaches_every_thread_of_the_process():
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    with Child() as child:
        assert len(os.listdir(f"/proc/{child.pid}/task")) == 2
        scale_processes.renice(child.pid, min(19, mine + 3))
        assert scale_processes.niceness(child.pid) == {min(19, mine + 3)}


@pytest.mark.skipif(os.geteuid() != 0, reason="lowering the test's nice value back takes CAP_SYS_NICE")
def test_the_node_hosts_and_the_submitter_are_reniced_and_the_services_not():
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    with Child() as host, Child() as placer:
        services = [SimpleNamespace(name="host-h0", proc=host, alive=True),
                    SimpleNamespace(name="placer", proc=placer, alive=True)]
        try:
            got = scale_processes.sim_priority(SimpleNamespace(services=services), 5)
            assert got == {"host-h0": [5], "submitter": [5]}
            assert scale_processes.niceness(placer.pid) == {mine}
        finally:
            scale_processes.restore_priority(5)
        assert scale_processes.niceness(os.getpid()) == {0}
    assert scale_processes.sim_priority(SimpleNamespace(services=services), 0) == {}


def placed(job: str, t: float, attempt: int = 1):
    return scale_bench.ev.JobPlaced(event_id=f"{job}-{t}", time=t, producer="placer", job_id=job, attempt=attempt,
                                    workers=())


def test_placed_times_are_of_the_running_jobs_and_their_last_placement():
    events = [placed("a", 1.0), placed("b", 1.5), placed("a", 2.0), placed("c", 3.0)]
    assert scale_bench.placed_times(events, {"a": 5.0, "c": 4.0}) == {"a": 2.0, "c": 3.0}
    assert scale_bench.placement_rates({"a": 0.0, "c": 0.0}, {"a": 2.0, "c": 3.0})[2] == 2
