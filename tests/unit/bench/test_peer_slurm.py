"""The pure parts of the Slurm side-by-side benchmark (bench/peer_slurm.py,
bench/slurm_cluster.py): its quantiles and ratios, and the Slurm configuration it writes.
Running Slurm itself is the benchmark's business, not a test's."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))

import peer_cpu  # noqa: E402
import peer_slurm  # noqa: E402
from peer_slurm import Result, job_script, pct, ratio, summary  # noqa: E402
from slurm_cluster import SlurmLayout, render_gres_conf, render_slurm_conf  # noqa: E402


def settings(conf: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in conf.splitlines() if not line.startswith(("NodeName", "PartitionName")))


def test_pct_is_the_nearest_rank():
    values = [float(v) for v in range(1, 101)]   # 1..100
    assert pct(values, .5) == 50
    assert pct(values, .99) == 99
    assert pct(values, 1.0) == 100
    assert pct([7.0], .99) == 7
    assert math.isnan(pct([], .5))


@given(st.lists(st.floats(-1e6, 1e6), min_size=1), st.floats(0.01, 1.0))
def test_pct_is_a_member_with_the_right_share_at_or_below(values, q):
    got = pct(values, q)
    assert got in values
    assert sum(v <= got for v in values) >= q * len(values) - 1e-9


def test_ratio():
    assert ratio(90.0, 30.0) == 3.0
    assert math.isnan(ratio(1.0, 0.0))


def test_job_script_names_the_job_by_its_schedulers_variable(tmp_path):
    assert job_script(tmp_path, "SLURM_JOB_ID") == f"date +%s.%N > {tmp_path}/$SLURM_JOB_ID"


def test_read_stamps_skips_a_stamp_still_being_written(tmp_path):
    (tmp_path / "1").write_text("1796457760.060559036\n")
    (tmp_path / "2").write_text("")
    assert peer_slurm.read_stamps(tmp_path) == {"1": 1796457760.060559036}


def test_summary_states_gpusched_against_each_slurm_setting():
    results = [Result("slurm-default", completed_per_s=20.0, start_ms=[1000.0] * 98 + [4000.0] * 2, calm_ms=[300.0]),
               Result("gpusched", completed_per_s=80.0, start_ms=[50.0] * 98 + [100.0] * 2, calm_ms=[30.0]),
               Result("gpusched", completed_per_s=60.0, start_ms=[40.0] * 98 + [300.0] * 2, calm_ms=[10.0])]
    lines = summary(results)
    # gpusched's medians over its two rounds: 70 jobs/s, p50 45 ms, p99 200 ms, calm 20 ms
    assert "gpusched vs slurm-default: completed jobs/s x3.50; p50 submit->start 1/22.2; " \
           "p99 submit->start 1/20.0; calm p50 1/15.0; calm p99 1/15.0" in [line.strip() for line in lines], lines


def test_slurm_conf_default_and_tuned(tmp_path):
    layout = SlurmLayout(tmp_path, nodes=4, gpus=8, port=30000)
    default, tuned = settings(render_slurm_conf(layout, False)), settings(render_slurm_conf(layout, True))
    assert default["AuthType"] == "auth/none" and default["ProctrackType"] == "proctrack/linuxproc"
    assert "SchedulerParameters" not in default and "SchedulerType" not in default   # Slurm's own defaults
    assert "batch_sched_delay=0" in tuned["SchedulerParameters"]
    assert all(str(tmp_path) in default[k] for k in ("StateSaveLocation", "SlurmdSpoolDir", "SlurmctldLogFile"))


def test_slurm_conf_gives_each_node_its_own_port_and_gpus(tmp_path):
    conf = render_slurm_conf(SlurmLayout(tmp_path, nodes=3, gpus=8, port=30000), False)
    nodes = [line for line in conf.splitlines() if line.startswith("NodeName=")]
    assert [n.split()[0] for n in nodes] == ["NodeName=n1", "NodeName=n2", "NodeName=n3"]
    assert [n.split("Port=")[1].split()[0] for n in nodes] == ["30001", "30002", "30003"]
    assert all("Gres=gpu:8" in n for n in nodes)
    assert "PartitionName=gpu Nodes=n1,n2,n3 " in conf


@pytest.mark.parametrize("gpus", [1, 8])
def test_gres_conf_names_one_fake_device_per_gpu(tmp_path, gpus):
    gres = render_gres_conf(SlurmLayout(tmp_path, nodes=2, gpus=gpus))
    assert gres.splitlines() == [f"NodeName=n{i} Name=gpu File={tmp_path}/dev/nvidia[0-{gpus - 1}]" for i in (1, 2)]


# A parent that starts a child which burns CPU, then both wait (alive, unreaped) until stdin closes.
_TREE = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-S", "-c",
    "import sys, time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.4: pass\\n"
    "print('burnt', flush=True)\\nsys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
print(child.pid, child.stdout.readline().decode().strip(), flush=True)
sys.stdin.read()
"""


def test_cpu_seconds_counts_live_descendants_once():
    """A node-agent's shims live through a run: their CPU is the agent's."""
    import subprocess
    parent = subprocess.Popen([sys.executable, "-S", "-c", _TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        child_pid, word = parent.stdout.readline().decode().split()
        assert word == "burnt"
        child = peer_cpu.cpu_seconds(int(child_pid))
        assert child >= 0.35
        tree = peer_cpu.cpu_seconds(parent.pid)
        assert tree >= child                                     # the child's CPU is in the parent's tree
        assert peer_cpu.cpu_seconds(parent.pid, int(child_pid)) == tree   # listed twice, counted once
        alone = peer_cpu.cpu_seconds(parent.pid, others=frozenset({int(child_pid)}))
        assert alone == pytest.approx(tree - child)              # a subtree counted on its own is left out
    finally:
        parent.stdin.close()
        parent.wait()


def test_stage_breakdown_reads_each_jobs_stamps_and_skips_a_job_without_its_folder(tmp_path):
    import json
    import os
    import time

    from peer_stages import STAGES, breakdown, job_stamps
    from gpusched.v1 import types_pb2

    folder = tmp_path / "agent-n1" / "j1-0-0"
    folder.mkdir(parents=True)
    created = time.time()
    (folder / "shim.json").write_text(json.dumps({"started_at": created + 0.010, "ended_at": created + 0.030}))
    job = types_pb2.Job(job_id="j1", attempt=0)
    for field, at in (("submitted_at", created - 0.050), ("placed_at", created - 0.020),
                      ("started_at", created + 0.015), ("ended_at", created + 0.040)):
        getattr(job, field).FromNanoseconds(int(at * 1e9))
    stamps = job_stamps(job, created - 0.060, created + 0.012, [tmp_path / "agent-n1"])
    assert stamps is not None, "the folder's birth time, the shim's status and the job's times were all found"
    assert abs(stamps["forked"] - os.stat(folder).st_mtime) < 1.0   # the folder's own creation
    assert stamps["sent"] < stamps["accepted"] < stamps["placed"] < stamps["spawned"] < stamps["stamp"]
    other = types_pb2.Job(job_id="j2", attempt=0)   # its agent folder is missing: left out
    lines = breakdown([job, other], {"j1": created - 0.060, "j2": created}, {"j1": created + 0.012, "j2": created},
                      tmp_path, pct)
    assert lines[0].split()[2] == "1"   # "stages over 1 jobs"
    assert len(lines) == 1 + len(STAGES)
    total = lines[STAGES.index(("total: sent -> workload's stamp", "sent", "stamp")) + 1].split()
    assert float(total[-1]) == pytest.approx(72.0, abs=0.01)   # 12 ms after creation minus 60 ms before


def test_slot_pairs_follow_each_gpu_and_leave_out_jobs_without_their_record_times(tmp_path):
    import json
    import time

    from peer_stages import SLOT_STAGES, slot_breakdown, slot_pairs
    from gpusched.v1 import types_pb2

    t0 = time.time()

    def job(job_id: str, gpu: int, begin: float, dir_name: str = "agent-n1") -> types_pb2.Job:
        """A one-GPU job on n1 whose shim spawned it at ``begin`` and saw it end 20 ms later."""
        folder = tmp_path / dir_name / f"{job_id}-0-0"
        folder.mkdir(parents=True)
        (folder / "shim.json").write_text(json.dumps({"started_at": t0 + begin, "ended_at": t0 + begin + 0.020}))
        j = types_pb2.Job(job_id=job_id, attempt=0)
        j.workers.add(worker=0, node="n1").gpus.add(index=gpu)
        for field, at in (("submitted_at", -1.0), ("placed_at", begin - 0.050),
                          ("started_at", begin + 0.005), ("ended_at", begin + 0.030)):
            getattr(j, field).FromNanoseconds(int((t0 + at) * 1e9))
        return j
    # GPU 0: a, then c (spawned later; listed first); GPU 1: b alone; d on GPU 0 has no record times.
    jobs = [job("c", 0, 1.0), job("a", 0, 0.0), job("b", 1, 0.5), job("d", 0, 2.0)]
    times = {}
    for j, base in (("a", 0.0), ("b", 0.5), ("c", 1.0)):
        times[("report", "WorkerFinished", j)] = t0 + base + 0.031
        times[("log", "WorkerFinished", j)] = t0 + base + 0.040
        times[("log", "JobPlaced", j)] = t0 + base - 0.045
        times[("view", "", j)] = t0 + base - 0.040
    pairs = slot_pairs(jobs, [tmp_path / "agent-n1"], times)
    assert len(pairs) == 1   # a -> c on GPU 0; b has no successor, d no record times
    pair = pairs[0]
    assert pair["exited"] == pytest.approx(t0 + 0.020) and pair["spawned"] == pytest.approx(t0 + 1.0)
    assert pair["log_finished"] == pytest.approx(t0 + 0.040) and pair["view"] == pytest.approx(t0 + 0.960)
    lines = slot_breakdown(jobs, tmp_path, times, pct)
    assert len(lines) == 1 + len(SLOT_STAGES)
    total = lines[1 + [label for label, _, _ in SLOT_STAGES].index("total: end seen -> next spawned")].split()
    assert float(total[-1]) == pytest.approx(980.0, abs=0.5)   # end seen at 20 ms, next spawned at 1 s
