"""Faults of a real cluster (tests/rig/): three brokers, the services and five node-agents
on hosts of their own (network namespaces), about a hundred short checkpointing jobs
(real processes that record their own runs) while the nemesis partitions agents from the
brokers and brokers from each other, cuts the placer's or the preemptor's link, degrades
links, pauses and kills processes, and heals, several times. Then nothing acknowledged is
lost, no GPU or job ran twice at once, every job ended, and the log passes its checks.

Root only (network namespaces); about three minutes. GPUSCHED_RIG_KINDS (comma
separated, of tests/rig/nemesis.py's KINDS), GPUSCHED_RIG_SECONDS and GPUSCHED_RIG_SEED
narrow or change a run; bench/network_faults.py runs the same for longer.
"""
from __future__ import annotations

import os
import shutil

import pytest

from tests.rig.nemesis import KINDS
from tests.rig.run import run_under_faults

pytestmark = [pytest.mark.broker,   # brokers of its own, started by deploy/kafka.sh: needs Java
              pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"),
                                 reason="needs root and iproute2 (network namespaces)")]


async def test_jobs_survive_faults_of_the_network_and_processes(tmp_path):
    kinds = tuple(k for k in os.environ.get("GPUSCHED_RIG_KINDS", ",".join(KINDS)).split(",") if k)
    # each kind two or three times in 150 s (kinds come in shuffled rounds), one at a time
    report = await run_under_faults(tmp_path, float(os.environ.get("GPUSCHED_RIG_SECONDS", 150)), jobs=100,
                                    agents=5, seed=int(os.environ.get("GPUSCHED_RIG_SEED", 37)), kinds=kinds,
                                    hold=(3.0, 6.0), gap=(2.0, 4.0))
    print(report.figures())
    assert report.violations == []
    assert report.acked >= 90 and not report.not_succeeded, report.not_succeeded
    assert {f.kind for f in report.faults} == set(kinds)
    assert all(f.healed for f in report.faults)
