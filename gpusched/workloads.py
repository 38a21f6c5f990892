"""Workload mixes for the demo, the benchmark and the end-to-end tests."""
from __future__ import annotations

import random

from gpusched.client import spec
from gpusched.v1 import types_pb2


def mixed_jobs(count: int, seed: int = 0, duration: tuple[float, float] = (0.2, 1.0),
               teams: tuple[str, ...] = ("vision", "speech", "llm")) -> list[types_pb2.JobSpec]:
    """Whole-GPU jobs of 1-8 GPUs, GPU shares, MIG slices and 2-node gangs of 8-GPU workers."""
    rng = random.Random(seed)
    jobs = []
    for i in range(count):
        team = teams[i % len(teams)]
        d = rng.uniform(*duration)
        shape = rng.random()
        if shape < 0.45:
            job = spec(f"train-{i}", team, gpus=rng.choice([1, 1, 2, 2, 4, 8]), duration=d)
        elif shape < 0.70:
            job = spec(f"infer-{i}", team, gpu_milli=rng.choice([100, 250, 300, 500, 700]), duration=d,
                       kind=types_pb2.JOB_KIND_INFERENCE, priority="production-inference")
        elif shape < 0.80:
            job = spec(f"mig-{i}", team, mig=rng.choice(["1g", "2g", "3g"]), duration=d,
                       kind=types_pb2.JOB_KIND_INFERENCE)
        else:
            job = spec(f"gang-{i}", team, gpus=8, workers=2, duration=d, priority="training-high")
        jobs.append(job)
    return jobs
