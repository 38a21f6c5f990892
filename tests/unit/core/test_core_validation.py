"""Admission validation: each invalid spec yields a FieldError naming the field at fault."""
from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gpusched.core.model import JobSpec, WorkerResources
from gpusched.core.validation import MAX_WORKERS, FieldError, PoolShape, validate_spec

from .builders import Log, make_node


def pool(name: str = "default"):
    """default: one 8-GPU H100 node and one 4-GPU L40S node (12 GPUs); other: 2 L40S only."""
    log = Log(
        make_node("h100", 8, "H100-80GB", cpu=64_000, mem=512_000),
        make_node("l40s", 4, "L40S-48GB", cpu=32_000, mem=256_000),
        make_node("o1", 2, "L40S-48GB", pool="other"),
    )
    return PoolShape.of(log.state.pool_nodes(name))


def spec(*, gpus: int | None = None, milli: int = 0, mig: str = "", cpu: int = 1000, mem: int = 1000,
         models: tuple[str, ...] = (), **fields) -> JobSpec:
    """A valid one-GPU spec unless told otherwise; ``fields`` are JobSpec fields."""
    if gpus is None:
        gpus = 0 if (milli or mig) else 1
    return JobSpec(**{"name": "job", "team": "team-a", **fields},
                   resources=WorkerResources(gpus, milli, mig, cpu, mem, models))


INVALID = [
    # id, spec kwargs, field (or fields), needs the pool's nodes
    ("zero-gpus", {"gpus": 0}, "spec.resources.gpus", False),
    ("negative-gpus", {"gpus": -2}, "spec.resources.gpus", False),
    ("share-over-1000", {"milli": 1001}, "spec.resources.gpu_milli", False),
    ("share-negative", {"milli": -5}, "spec.resources.gpu_milli", False),
    ("whole-and-share", {"gpus": 1, "milli": 500}, "spec.resources", False),
    ("whole-and-mig", {"gpus": 1, "mig": "1g"}, "spec.resources", False),
    ("share-and-mig", {"milli": 500, "mig": "1g"}, "spec.resources", False),
    ("unknown-mig-profile", {"mig": "5g"}, "spec.resources.mig_profile", False),
    ("garbage-mig-profile", {"mig": "big"}, "spec.resources.mig_profile", False),
    ("unknown-model", {"models": ("H10O",)}, "spec.resources.gpu_models[0]", False),
    ("second-model-unknown", {"models": ("H100-80GB", "nope")}, "spec.resources.gpu_models[1]", False),
    ("mig-on-non-mig-models", {"mig": "1g", "models": ("L40S-48GB",)}, "spec.resources.gpu_models", False),
    ("empty-team", {"team": ""}, "spec.team", False),
    ("bad-team", {"team": "a team"}, "spec.team", False),
    ("empty-name", {"name": ""}, "spec.name", False),
    ("bad-name", {"name": "-lead-dash"}, "spec.name", False),
    ("bad-pool", {"pool": ""}, "spec.pool", False),
    ("bad-priority-class", {"priority_class": "urgent"}, "spec.priority_class", False),
    ("workers-zero", {"workers": 0}, "spec.workers", False),
    ("workers-negative", {"workers": -1}, "spec.workers", False),
    ("workers-too-many", {"workers": MAX_WORKERS + 1}, "spec.workers", False),
    ("negative-cpu", {"cpu": -1}, "spec.resources.cpu_milli", False),
    ("negative-memory", {"mem": -1}, "spec.resources.memory_mib", False),
    ("negative-runtime", {"max_runtime_s": -1.0}, "spec.max_runtime_s", False),
    ("nan-runtime", {"max_runtime_s": math.nan}, "spec.max_runtime_s", False),
    ("inf-runtime", {"max_runtime_s": math.inf}, "spec.max_runtime_s", False),
    ("negative-checkpoint-interval", {"checkpoint_interval_s": -5.0}, "spec.checkpoint_interval_s", False),
    ("nan-checkpoint-interval", {"checkpoint_interval_s": math.nan}, "spec.checkpoint_interval_s", False),
    ("negative-sim-duration", {"simulated_duration_s": -0.5}, "spec.simulated_duration_s", False),
    ("nan-sim-duration", {"simulated_duration_s": math.nan}, "spec.simulated_duration_s", False),
    ("negative-max-restarts", {"max_restarts": -1}, "spec.max_restarts", False),
    ("nul-in-an-argument", {"command": ("echo", "a\x00b")}, "spec.command[1]", False),
    ("nul-alone", {"command": ("\x00",)}, "spec.command[0]", False),
    # against the nodes of the pool
    ("more-gpus-than-any-node", {"gpus": 9}, "spec.resources.gpus", True),
    ("more-gpus-than-allowed-model", {"gpus": 5, "models": ("L40S-48GB",)},
     ("spec.resources.gpus", "spec.workers"), True),   # one worker is already more than the 4 L40S
    ("gang-larger-than-pool", {"gpus": 8, "workers": 2}, "spec.workers", True),
    ("gang-larger-than-allowed-nodes", {"gpus": 1, "workers": 5, "models": ("L40S-48GB",)}, "spec.workers", True),
    ("model-absent-from-pool", {"models": ("A100-40GB",)}, "spec.resources.gpu_models", True),
    ("mig-in-pool-without-mig", {"mig": "1g", "pool": "other"}, "spec.resources.gpu_models", True),
    ("cpu-over-every-node", {"cpu": 64_001}, "spec.resources.cpu_milli", True),
    ("memory-over-every-node", {"mem": 512_001}, "spec.resources.memory_mib", True),
    ("memory-over-allowed-nodes", {"mem": 300_000, "models": ("L40S-48GB",)}, "spec.resources.memory_mib", True),
]


@pytest.mark.parametrize("kw, field, with_pool", [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_spec_names_the_field(kw, field, with_pool):
    s = spec(**kw)
    errors = validate_spec(s, pool(s.pool if s.pool else "default"))
    assert errors, f"{kw} accepted"
    assert all(isinstance(e, FieldError) and e.message for e in errors)
    expected = {field} if isinstance(field, str) else set(field)
    assert {e.field for e in errors} == expected, [str(e) for e in errors]
    assert any(str(e).startswith(f"{f}: ") for e in errors for f in expected)
    if with_pool:
        # the problem is one of the pool: without nodes to check against, the spec passes
        assert validate_spec(s, PoolShape()) == []


VALID = [
    ("one-gpu", {}),
    ("largest-node", {"gpus": 8}),
    ("gang-fills-pool", {"gpus": 1, "workers": 12}),
    ("gang-fills-allowed-model", {"gpus": 1, "workers": 4, "models": ("L40S-48GB",)}),
    ("share-full", {"milli": 1000}),
    ("share-tiny", {"milli": 1}),
    ("mig", {"mig": "3g"}),
    ("mig-with-suffix", {"mig": "3g.40gb", "models": ("H100-80GB", "L40S-48GB")}),
    ("mig-7g", {"mig": "7G"}),
    ("no-restarts", {"max_restarts": 0}),
    ("best-effort", {"priority_class": "best-effort", "preemptible": True}),
    ("production", {"priority_class": "production-inference", "preemptible": False}),
    ("cpu-exactly-largest", {"cpu": 64_000, "mem": 512_000}),
    ("zero-cpu-mem", {"cpu": 0, "mem": 0}),
    ("numbers", {"max_runtime_s": 3600.0, "checkpoint_interval_s": 600.0, "simulated_duration_s": 1.5}),
    ("dotted-names", {"name": "run_1.v2-final", "team": "ml.infra_team-3"}),
    ("other-pool", {"pool": "other", "gpus": 2}),
    ("command-with-control-characters", {"command": ("sh", "-c", "printf '\\033[2J'\n\techo \x1b\x7f")}),
]


@pytest.mark.parametrize("kw", [c[1] for c in VALID], ids=[c[0] for c in VALID])
def test_valid_spec_has_no_errors(kw):
    s = spec(**kw)
    assert validate_spec(s, pool(s.pool)) == []
    assert validate_spec(s, PoolShape()) == []


def test_huge_request_passes_when_pool_is_empty():
    # With no nodes registered yet, only the spec itself is checked.
    assert validate_spec(spec(gpus=100, workers=100), PoolShape()) == []
    assert validate_spec(spec(gpus=100, workers=100), pool()) != []


def test_several_problems_are_all_reported():
    s = dataclasses.replace(spec(team="", workers=0, cpu=-1), priority_class="nope")
    fields = {e.field for e in validate_spec(s, pool())}
    assert fields == {"spec.team", "spec.workers", "spec.resources.cpu_milli", "spec.priority_class"}


def test_a_pool_shape_is_one_group_per_model_with_the_largest_and_total_sizes():
    shape = pool()
    assert [(g.model, g.mig_capable, g.most_gpus, g.total_gpus, g.most_cpu_milli, g.most_memory_mib)
            for g in shape.groups] == [("H100-80GB", True, 8, 8, 64_000, 512_000),
                                        ("L40S-48GB", False, 4, 4, 32_000, 256_000)]
    log = Log(make_node("a", 2, "L40S-48GB", cpu=8_000), make_node("b", 6, "L40S-48GB", cpu=4_000))
    [group] = PoolShape.of(log.state.pool_nodes("default")).groups
    assert (group.most_gpus, group.total_gpus, group.most_cpu_milli) == (6, 8, 8_000)


def reference_pool_errors(s: JobSpec, nodes) -> set[str]:
    """The fields a scan of every node finds at fault (what validation did before pools
    were summarised per model): the oracle for PoolShape."""
    from gpusched.core.catalog import is_mig_capable
    r = s.resources
    usable = [n for n in nodes if r.allows(n.model) and (not r.mig_profile or is_mig_capable(n.model))]
    if not usable:
        return {"spec.resources.gpu_models"}
    fields = set()
    if r.gpus > max(len(n.gpus) for n in usable):
        fields.add("spec.resources.gpus")
    if r.gpus and r.gpus * s.workers > sum(len(n.gpus) for n in usable):
        fields.add("spec.workers")
    if r.cpu_milli > max(n.info.cpu_milli for n in usable):
        fields.add("spec.resources.cpu_milli")
    if r.memory_mib > max(n.info.memory_mib for n in usable):
        fields.add("spec.resources.memory_mib")
    return fields


MODELS = ("H100-80GB", "A100-40GB", "L40S-48GB", "T4-16GB")


@settings(max_examples=300, deadline=None)
@given(nodes=st.lists(st.tuples(st.sampled_from(MODELS), st.integers(0, 8), st.integers(1, 8), st.integers(1, 8)),
                      min_size=1, max_size=12),
       form=st.sampled_from(["gpus", "milli", "mig"]), gpus=st.integers(1, 16), workers=st.integers(1, 20),
       cpu=st.integers(0, 9), mem=st.integers(0, 9),
       models=st.lists(st.sampled_from(MODELS), max_size=2, unique=True))
def test_validation_against_a_pool_shape_finds_what_a_scan_of_every_node_finds(nodes, form, gpus, workers,
                                                                               cpu, mem, models):
    log = Log(*(make_node(f"n{i}", g, model, cpu=c * 1000, mem=m * 1000)
                for i, (model, g, c, m) in enumerate(nodes)))
    s = spec(gpus=gpus if form == "gpus" else 0, milli=300 if form == "milli" else 0,
             mig="2g" if form == "mig" else "", cpu=cpu * 1000, mem=mem * 1000, models=tuple(models),
             workers=workers)
    assume(validate_spec(s, PoolShape()) == [])   # the pool is checked only for specs valid alone
    nodes_ = log.state.pool_nodes("default")
    assert {e.field for e in validate_spec(s, PoolShape.of(nodes_))} == reference_pool_errors(s, nodes_)
