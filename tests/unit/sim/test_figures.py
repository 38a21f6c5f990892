"""The published figures (docs/figures, ``gpusched.sim.figures``) come back at HEAD.

Each simulator's headline figures are checked on one cheap case against the file its
``--publish`` wrote: a changed default that moves a published figure fails here until the
figure is published again by its command. The static benchmark is also checked without the
trace, on the property whose loss once broke it unnoticed: every arrival is offered.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpusched.core.model import WorkerResources
from gpusched.policies.scheduler import DEFAULT_MAX_JOB_TEST
from gpusched.sim import dynamic, figures, reclaim, static, traces
from gpusched.sim.traces import Task
from gpusched.sim.workload import gpu_node

FIGURES = Path(__file__).resolve().parents[3] / figures.DEFAULT_FOLDER
needs_trace = pytest.mark.skipif(not (traces.TRACE_DIR / traces.NODE_LIST).exists(), reason="no openb trace")


def test_static_offers_every_arrival_however_many():
    """More arrivals than a placer cycle tests by default: the benchmark's one cycle must
    still offer each, so a cluster that holds them all ends full."""
    nodes = [gpu_node(f"n{i}", "H100-80GB", 8, 10_000_000, 100_000_000) for i in range(400)]
    tasks = [Task(f"t{i}", WorkerResources(gpus=1, cpu_milli=1, memory_mib=1)) for i in range(100)]
    run = static.pack(nodes, tasks, "best-fit", seed=1)
    assert run.tasks > DEFAULT_MAX_JOB_TEST + 1000
    assert run.placed == 400 * 8 and run.final == 1.0


@needs_trace
@pytest.mark.parametrize("policy", ["best-fit", "fgd"])
def test_static_published_figure_comes_back(policy):
    published = figures.load(FIGURES, "static")
    seed = published["seeds"][0]
    entry = published["summary"]["default"][policy]
    run = static.simulate("default", policy, seed)
    assert 100 * run.final == pytest.approx(entry["seeds"][0], abs=0.01)
    # and the published mean is the method's: within half a point of the paper's figure
    assert entry["mean"] == pytest.approx(entry["published"], abs=0.5)


# The dynamic figures: one configuration of each published run, run again.
DYNAMIC_CHECKS = [
    ("dynamic-synthetic-s0", "fifo+best-fit+no-preemption"),
    ("dynamic-synthetic-s0-h12", "defaults+quotas"),            # the preemptor's defaults
    ("dynamic-synthetic-s0-no-preemption", "priority+best-fit"),   # the cycle alone, without quotas
]
OPENB_CHECKS = [("dynamic-openb-default", "fifo+best-fit+no-preemption")]


def _run_again(name: str, config: str, split: str = "", topology: tuple[str, str] = ()) -> tuple[dict, dict]:
    """One configuration of a published run, again; ``split``: with services, one split;
    ``topology``: on a topology, one (pool levels, gang request) pair."""
    published = figures.load(FIGURES, name)
    args = dynamic.build_parser().parse_args([*published["argv"], "--configs", config,
                                              *(["--split", split] if split else []),
                                              *(["--topology-levels", topology[0], "--gang-topology", topology[1]]
                                                if topology else [])])
    _, [summary] = dynamic.run_configs(args, dynamic.workload_of(args))
    label = f"{config}@{split}" if split else config
    label = f"{label}@{topology[0]}/{topology[1]}" if topology else label
    expected = next(s for s in published["summaries"] if s["config"] == label)
    return json.loads(json.dumps(dynamic.published(summary))), expected


def _differences(again, expected, where: str = "") -> list[str]:
    """Where two summaries differ: every count and name exactly, every float within a
    relative 1e-9 (numpy's sums may round the last digit another way from one release to
    the next; no decision of the simulator hangs on it)."""
    if isinstance(expected, dict) and isinstance(again, dict):
        if again.keys() != expected.keys():
            return [f"{where}: keys {sorted(again)} != {sorted(expected)}"]
        return [d for k in expected for d in _differences(again[k], expected[k], f"{where}.{k}")]
    if isinstance(expected, list) and isinstance(again, list) and len(again) == len(expected):
        return [d for i, (a, e) in enumerate(zip(again, expected)) for d in _differences(a, e, f"{where}[{i}]")]
    if isinstance(expected, float) and isinstance(again, float):
        return [] if again == pytest.approx(expected, rel=1e-9) else [f"{where}: {again} != {expected}"]
    return [] if again == expected else [f"{where}: {again!r} != {expected!r}"]


def test_differences_tolerate_only_the_last_digits_of_floats():
    assert _differences({"a": [1, 0.8918537184537797]}, {"a": [1, 0.8918537184537796]}) == []
    assert _differences({"a": [2, 0.5]}, {"a": [1, 0.5]}) == [".a[0]: 2 != 1"]
    assert _differences({"a": 0.5001}, {"a": 0.5}) == [".a: 0.5001 != 0.5"]
    assert _differences({"a": 1}, {"b": 1}) != []


@pytest.mark.parametrize("name, config", DYNAMIC_CHECKS)
def test_dynamic_published_figures_come_back(name, config):
    again, expected = _run_again(name, config)
    assert _differences(again, expected) == []


def test_dynamic_services_figures_come_back():
    """The services beside training: the static split's run of the shorter configuration."""
    again, expected = _run_again("dynamic-synthetic-s0-h6-svc12", "priority+best-fit+loss-per-wait=inf", "static")
    assert again["services"]["split"] == "static"
    assert _differences(again, expected) == []


def test_dynamic_topology_figures_come_back():
    """Gangs on a topology: the run with the pool's levels declared and gangs requiring
    one rack (the planner's and the preemptor's domains both decide it)."""
    again, expected = _run_again("dynamic-synthetic-s0-h24-topology", "defaults+quotas",
                                 topology=("declared", "required-rack"))
    assert again["topology"]["pool_levels"] == {"default": ["rack", "block"]}
    assert _differences(again, expected) == []


@needs_trace
@pytest.mark.parametrize("name, config", OPENB_CHECKS)
def test_openb_dynamic_published_figures_come_back(name, config):
    again, expected = _run_again(name, config)
    assert _differences(again, expected) == []


def test_reclaim_published_figures_come_back():
    """The first published configuration of the borrow-and-reclaim runs (two teams, the
    default guarantee hold), run again with the published arguments."""
    published = figures.load(FIGURES, "reclaim")
    expected = published["summaries"][0]
    again = reclaim.summary(expected["teams"], published["seeds"], published["hours"],
                            expected["departures_when_steady"], expected["guarantee_hold_s"])
    assert _differences(again, expected) == []
    body = {k: v for k, v in published.items() if k not in ("name", "command")}
    assert (FIGURES / "reclaim.md").read_text() == figures.page("reclaim", published["command"],
                                                                 reclaim.published_table(body))


@pytest.mark.parametrize("name", sorted(p.stem for p in FIGURES.glob("dynamic-*.json")))
def test_dynamic_pages_are_their_figures(name):
    """What a reader reads, ``<name>.md``, is the page ``--publish`` renders from the
    figures the tests above run again (``<name>.json``): an edited table fails here."""
    data = figures.load(FIGURES, name)
    body = {k: v for k, v in data.items() if k not in ("name", "command")}
    assert (FIGURES / f"{name}.md").read_text() == figures.page(name, data["command"], dynamic.published_table(body))


def test_the_index_lists_every_published_result():
    """docs/figures/README.md is what ``--publish`` writes: every result in the folder."""
    assert (FIGURES / figures.INDEX).read_text() == figures.index(FIGURES)
    assert len(figures.index(FIGURES).splitlines()) > len(list(FIGURES.glob("*.json")))


def test_the_published_command_leaves_out_where_files_went():
    assert figures.command_line("gpusched simulate static", ["--all", "--out", "/tmp/x", "--publish", "d"]) \
        == "gpusched simulate static --all --publish d"
    assert figures.command_line("p", ["--out=/tmp/x", "--seeds", "1"]) == "p --seeds 1"
