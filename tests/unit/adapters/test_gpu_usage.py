"""Usage samplers (NVML through a small fake, and the simulated model) and the usage
record's wire form."""
from __future__ import annotations

import math

import pytest

from gpusched.adapters.gpus.gpu_inventory import simulated_gpus
from gpusched.adapters.gpus.gpu_usage import (
    NvmlSampler, RunningWorker, SimulatedSampler, UsageRule, parse_usage_rule,
)
from gpusched.adapters.nodes.usage_records import (
    UNMEASURED, GpuSample, UsageRecordError, WorkerUsage, decode_usage, encode_usage,
)
from gpusched.core.model import GpuSlot
from gpusched.v1 import usage_pb2
from tests.unit.adapters.fake_nvml import FakeNvml


GPUS = simulated_gpus("2xH100-80GB", "n1")


def worker(job="j", *slots, name="job", kind="training", usage_file=None, w=0):
    return RunningWorker(job, 0, w, name, kind, tuple(slots), usage_file)


def test_nvml_whole_gpus_read_utilization_memory_and_power_once_per_gpu():
    nvml = FakeNvml({0: {"sm": 87, "used_mib": 61_000, "power_mw": 512_345}, 1: {"sm": 3, "used_mib": 900, "power_mw": 70_000}})
    sampler = NvmlSampler(nvml, GPUS)
    sampler.start()
    got = sampler.read([worker("a", GpuSlot(0), GpuSlot(1))])
    assert got[("a", 0, 0)] == (GpuSample(0, "SIM-n1-0", 1000, 87.0, 61_000, 512.345),
                                GpuSample(1, "SIM-n1-1", 1000, 3.0, 900, 70.0))
    sampler.close()
    assert nvml.initialised == 0


def test_nvml_shares_of_one_gpu_each_read_the_whole_gpu():
    nvml = FakeNvml({0: {"sm": 40, "used_mib": 10_000, "power_mw": 300_000}, 1: {}})
    sampler = NvmlSampler(nvml, GPUS)
    sampler.start()
    got = sampler.read([worker("a", GpuSlot(0, 250)), worker("b", GpuSlot(0, 500))])
    assert [s.sm_percent for s in got[("a", 0, 0)] + got[("b", 0, 0)]] == [40.0, 40.0]
    assert [s.milli for s in got[("a", 0, 0)] + got[("b", 0, 0)]] == [250, 500]


def test_nvml_readings_it_cannot_take_are_unmeasured_not_errors():
    nvml = FakeNvml({0: {"used_mib": 5}, 1: {}})   # NOT_SUPPORTED for utilization and power
    sampler = NvmlSampler(nvml, GPUS)
    sampler.start()
    [sample] = sampler.read([worker("a", GpuSlot(0))])[("a", 0, 0)]
    assert (sample.sm_percent, sample.memory_used_mib, sample.power_w) == (UNMEASURED, 5, UNMEASURED)


def test_nvml_mig_reports_the_instance_memory_and_no_sm_utilization():
    nvml = FakeNvml({0: {"sm": 99, "used_mib": 1, "power_mw": 1}, 1: {}},
                    {0: [{"start": 0, "uuid": "MIG-a", "used_mib": 7_000}, {"start": 4, "uuid": "MIG-b", "used_mib": 300}]})
    sampler = NvmlSampler(nvml, GPUS)
    sampler.start()
    [sample] = sampler.read([worker("m", GpuSlot(0, 428, "3g", 4))])[("m", 0, 0)]
    assert sample == GpuSample(0, "MIG-b", 428, UNMEASURED, 300, UNMEASURED, "3g")
    [lost] = sampler.read([worker("m", GpuSlot(0, 142, "1g", 6))])[("m", 0, 0)]   # no such instance
    assert (lost.uuid, lost.memory_used_mib, lost.sm_percent) == ("SIM-n1-0", -1, UNMEASURED)


def test_simulated_training_keeps_its_gpus_about_90_percent_busy():
    sampler = SimulatedSampler(GPUS, seed=1)
    readings = [sampler.read([worker("a", GpuSlot(0))])[("a", 0, 0)][0] for _ in range(200)]
    mean = sum(r.sm_percent for r in readings) / len(readings)
    assert 85 <= mean <= 95
    assert all(0 <= r.sm_percent <= 100 and r.power_w > 0 and r.memory_used_mib > 0 for r in readings)


def test_simulated_shares_read_the_sum_of_their_gpus_tenants():
    sampler = SimulatedSampler(GPUS, rules=(UsageRule("inf-*", 40),))
    got = sampler.read([worker("a", GpuSlot(0, 500), name="inf-a", kind="inference"),
                        worker("b", GpuSlot(0, 250), name="inf-b", kind="inference")])
    # 40 % of a half plus 40 % of a quarter: the GPU is 30 % busy, as NVML would read it
    assert [s.sm_percent for s in got[("a", 0, 0)] + got[("b", 0, 0)]] == [30.0, 30.0]


def test_a_rule_pins_a_jobs_load_and_an_idle_job_still_holds_memory():
    sampler = SimulatedSampler(GPUS, rules=(parse_usage_rule("notebook-*=0"),))
    [sample] = sampler.read([worker("a", GpuSlot(1), name="notebook-7")])[("a", 0, 0)]
    assert sample.sm_percent == 0.0
    assert sample.memory_used_mib > 0
    assert sample.power_w == pytest.approx(70.0)   # a tenth of 700 W


def test_the_workloads_own_statement_wins(tmp_path):
    usage_file = tmp_path / "usage"
    sampler = SimulatedSampler(GPUS, rules=(UsageRule("*", 0),))
    w = worker("a", GpuSlot(0), usage_file=usage_file)
    assert sampler.read([w])[("a", 0, 0)][0].sm_percent == 0.0          # no file yet: the rule
    usage_file.write_text("62.5\n")
    assert sampler.read([w])[("a", 0, 0)][0].sm_percent == 62.5
    usage_file.write_text("not a number")
    assert sampler.read([w])[("a", 0, 0)][0].sm_percent == 0.0


def test_simulated_mig_mirrors_nvml_memory_but_no_sm():
    sampler = SimulatedSampler(GPUS)
    [sample] = sampler.read([worker("m", GpuSlot(0, 428, "3g", 0))])[("m", 0, 0)]
    assert (sample.sm_percent, sample.power_w, sample.mig_profile) == (UNMEASURED, UNMEASURED, "3g")
    assert 0 < sample.memory_used_mib < GPUS[0].memory_mib / 2


@pytest.mark.parametrize("text", ["x", "=5", "a=", "a=101", "a=-1", "a=nan", "a=five"])
def test_bad_usage_rules_are_refused_with_the_expected_form(text):
    with pytest.raises(ValueError, match="PATTERN=PERCENT"):
        parse_usage_rule(text)


# --- the record ------------------------------------------------------------------------
RECORD = WorkerUsage("r1", "n1", "p1", "job-1", 2, 1, 1_700_000_000.5, 5.0,
                     (GpuSample(0, "GPU-0", 1000, 87.5, 61_000, 512.0),
                      GpuSample(3, "MIG-x", 428, UNMEASURED, 300, UNMEASURED, "3g")), simulated=True)


def test_a_record_survives_the_wire():
    assert decode_usage(encode_usage(RECORD)) == RECORD


def _tampered(**change) -> bytes:
    msg = usage_pb2.WorkerUsage.FromString(encode_usage(RECORD))
    for name, value in change.items():
        if name.startswith("gpu_"):
            setattr(msg.gpus[0], name[4:], value)
        else:
            setattr(msg, name, value)
    return msg.SerializeToString()


@pytest.mark.parametrize("data, field", [
    (b"\xff\xff\xff", "not a WorkerUsage"),
    (_tampered(record_id=""), "record_id"), (_tampered(job_id=""), "job_id"), (_tampered(node=""), "node"),
    (_tampered(attempt=-1), "attempt"), (_tampered(worker=-2), "worker"),
    (_tampered(time=0.0), "time"), (_tampered(time=math.inf), "time"),
    (_tampered(window_s=0.0), "window_s"), (_tampered(window_s=math.nan), "window_s"),
    (_tampered(gpu_milli=0), r"gpus\[0\].milli"), (_tampered(gpu_milli=1001), r"gpus\[0\].milli"),
    (_tampered(gpu_sm_percent=100.5), r"gpus\[0\].sm_percent"), (_tampered(gpu_sm_percent=math.nan), r"gpus\[0\].sm_percent"),
    (_tampered(gpu_power_w=-3.0), r"gpus\[0\].power_w"), (_tampered(gpu_memory_used_mib=-5), r"gpus\[0\].memory_used_mib"),
])
def test_a_malformed_record_is_refused_naming_the_field(data, field):
    with pytest.raises(UsageRecordError, match=field):
        decode_usage(data)
