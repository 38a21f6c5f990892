"""Validation of GPU-memory requests and of MIG against the MIG mode nodes registered."""
from __future__ import annotations

from dataclasses import replace

import pytest

from gpusched.core.model import JobSpec, MigInstance, MigMode, WorkerResources
from gpusched.core.validation import PoolShape, validate_spec

from .builders import Log, make_node


def job(**res) -> JobSpec:
    return JobSpec(name="job", team="team-a", resources=WorkerResources(**res))


def mig_mode(info, mode: MigMode, instances=()):
    return replace(info, gpus=tuple(replace(g, mig_mode=mode, mig_instances=instances) for g in info.gpus))


def shape(*nodes) -> PoolShape:
    return PoolShape.of(Log(*nodes).state.pool_nodes("default"))


MIXED = shape(make_node("h100", 8, "H100-80GB"), make_node("l40s", 4, "L40S-48GB"))
MIG_OFF = shape(mig_mode(make_node("h100", 8, "H100-80GB"), MigMode.DISABLED))
MIG_ON = shape(mig_mode(make_node("h100", 8, "H100-80GB"), MigMode.ENABLED, (MigInstance("7g.80gb", 0, "MIG-7"),)))


def fields(spec: JobSpec, pool: PoolShape = PoolShape()) -> list[str]:
    return [e.field for e in validate_spec(spec, pool)]


@pytest.mark.parametrize("res, pool, message", [
    ({"gpu_milli": 500, "gpu_memory_mib": -1}, PoolShape(), "must be positive"),
    ({"gpus": 1, "gpu_memory_mib": 1000}, PoolShape(), "only a GPU share"),
    ({"mig_profile": "1g", "gpu_memory_mib": 1000}, PoolShape(), "only a GPU share"),
    ({"gpu_milli": 500, "gpu_memory_mib": 200_000}, PoolShape(), "exceeds every allowed GPU"),
    ({"gpu_milli": 500, "gpu_memory_mib": 50_000, "gpu_models": ("L40S-48GB",)}, PoolShape(),
     "exceeds every allowed GPU (at most 46068 MiB)"),
    ({"gpu_milli": 500, "gpu_memory_mib": 90_000}, MIXED, "exceeds the largest GPU in pool default (81559 MiB)"),
])
def test_gpu_memory_errors_name_the_field(res, pool, message):
    errors = validate_spec(job(**res), pool)
    assert [e.field for e in errors] == ["spec.resources.gpu_memory_mib"]
    assert message in errors[0].message


def test_gpu_memory_request_within_a_gpu_is_valid():
    assert fields(job(gpu_milli=500, gpu_memory_mib=40_000), MIXED) == []
    assert fields(job(gpu_milli=500, gpu_memory_mib=40_000)) == []


def test_mig_needs_mig_enabled_or_simulated_gpus():
    assert fields(job(mig_profile="1g"), MIXED) == []
    assert fields(job(mig_profile="1g"), MIG_ON) == []
    errors = validate_spec(job(mig_profile="1g"), MIG_OFF)
    assert [e.field for e in errors] == ["spec.resources.gpu_models"] and "MIG enabled" in errors[0].message


def test_whole_gpus_and_shares_need_a_gpu_with_mig_off():
    assert fields(job(gpus=1), MIG_OFF) == [] and fields(job(gpu_milli=300), MIG_OFF) == []
    assert fields(job(gpus=1), MIG_ON) == ["spec.resources.gpus"]
    errors = validate_spec(job(gpu_milli=300), MIG_ON)
    assert [e.field for e in errors] == ["spec.resources.gpu_milli"] and "MIG enabled" in errors[0].message
