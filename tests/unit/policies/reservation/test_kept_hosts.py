"""The nodes that could ever host a shape, and the nodes open (``is_open``), kept between
cycles (``reservation.hosts``), against a fresh pass over the nodes after random node and
job changes through the reducer."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st

from gpusched.core import events as ev
from gpusched.core.state import JobState
from gpusched.policies.reservation.hosts import KeptHosts, OpenNodes, find_hosts, is_open
from tests.unit.core.builders import Log, make_node, make_spec, whole
from tests.unit.policies.kept_ends_steps import NODES, apply_step, step as kept_ends_step

NAMES = ("n0", "n1", "n2", "n3")
SHAPES = (make_spec(gpus=1), make_spec(gpus=4), make_spec(milli=500), make_spec(gpus=1, models=("A100-80GB",)),
          make_spec(gpus=1, cpu=40_000), make_spec(gpus=2, pool="other"))

node_change = st.one_of(
    st.tuples(st.just("register"), st.integers(0, 3), st.sampled_from(("H100-80GB", "A100-80GB")),
              st.sampled_from((16_000, 64_000)), st.sampled_from(("default", "other"))),
    st.tuples(st.just("gpu"), st.integers(0, 3), st.integers(0, 3), st.booleans()),
    st.tuples(st.just("cordon"), st.integers(0, 3)),
    st.tuples(st.just("uncordon"), st.integers(0, 3)),
    st.tuples(st.just("lost"), st.integers(0, 3)),
)


def change(log: Log, s: tuple) -> None:
    """Apply one node event (refused ones change nothing, as in the log)."""
    kind, name = s[0], NAMES[s[1]]
    if kind == "register":
        log(ev.NodeRegistered, node=make_node(name, gpus=4, model=s[2], cpu=s[3], pool=s[4]))
    elif kind == "gpu":
        log(ev.GpuHealthChanged, node=name, gpu_index=s[2], healthy=s[3])
    elif kind == "cordon":
        log(ev.NodeCordoned, node=name)
    elif kind == "uncordon":
        log(ev.NodeUncordoned, node=name)
    else:
        log(ev.NodeLost, node=name)


def job(spec) -> JobState:
    return JobState(job_id="j", spec=spec, seq=0, submitted_at=0.0)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=st.lists(st.lists(node_change, max_size=3), max_size=12))
def test_kept_hosts_are_those_a_fresh_pass_finds(changes):
    """Between two looks any number of node changes (none, often): every shape's hosts,
    in the state's order, are what a pass over the nodes finds now."""
    log = Log(make_node("n0"), make_node("n1", model="A100-80GB"), make_node("n2", pool="other"))
    kept = KeptHosts()
    for batch in [[], *changes]:
        for s in batch:
            change(log, s)
        for spec in SHAPES:
            nodes, names = kept.hosts(log.state, job(spec))
            fresh_nodes, fresh_names = find_hosts(log.state, job(spec))
            assert [n.name for n in nodes] == [n.name for n in fresh_nodes]
            assert names == fresh_names


def test_a_cordoned_node_is_no_host_at_the_next_look():
    """A cordoned node leaves the kept hosts (breaking the reducer's journal of nodes,
    e.g. not journalling a cordon, fails here)."""
    log = Log(make_node("n0"), make_node("n1"))
    kept = KeptHosts()
    assert [n.name for n in kept.hosts(log.state, job(SHAPES[0]))[0]] == ["n0", "n1"]
    assert log(ev.NodeCordoned, node="n0").accepted
    assert [n.name for n in kept.hosts(log.state, job(SHAPES[0]))[0]] == ["n1"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rounds=st.lists(st.lists(kept_ends_step, max_size=4), max_size=12))
def test_open_nodes_kept_are_those_a_fresh_pass_finds(rounds):
    """Jobs placed, started, stopped, partly ended; GPUs failing; nodes lost and back; the
    journal overrun: at each refresh the nodes kept closed are exactly those not open."""
    log = Log(*(make_node(n, gpus=6, cpu=64_000, mem=512_000) for n in NODES))
    kept, made = OpenNodes(), []
    for batch in [[], *rounds]:
        for s in batch:
            apply_step(log, s, made)
        kept.refresh(log.state)
        assert kept.closed == {n.name for n in log.state.nodes.values() if not is_open(n)}


def test_a_node_freed_by_a_requeued_job_is_open_again():
    """A full node whose job is preempted and requeued (its workers forgotten) is open at
    the next refresh (breaking the journal's use, e.g. not looking again at the nodes a
    job held before, fails here)."""
    log = Log(make_node("n0", gpus=2))
    log.submit("a", make_spec(gpus=2, cpu=0, mem=0))
    log.run("a", ("n0", whole(0, 1)))
    kept = OpenNodes()
    kept.refresh(log.state)
    assert kept.closed == {"n0"}
    assert log(ev.JobPreempted, job_id="a", attempt=0, for_job="other").accepted
    log.stopped("a")
    assert log.job("a").workers == ()
    kept.refresh(log.state)
    assert kept.closed == set()


def test_hosts_of_several_classes_come_in_the_state_order():
    """Nodes of two models, interleaved: a sweep offers hosts in the state's order, as a
    pass over the nodes would (breaking it, e.g. listing class after class, fails here)."""
    log = Log(make_node("n0"), make_node("n1", model="A100-80GB"), make_node("n2"))
    nodes, _ = KeptHosts().hosts(log.state, job(SHAPES[0]))
    assert [n.name for n in nodes] == ["n0", "n1", "n2"]


def test_a_cordon_moves_the_node_instead_of_finding_every_host_again():
    """The classes and the hosts kept survive a cordon, a GPU failing and a node lost (the
    reducer journals those nodes) and read as a fresh pass (breaking the move, e.g.
    skipping the journalled nodes, fails here), a registration too (a new node joins)."""
    log = Log(make_node("n0"), make_node("n1", model="A100-80GB"), make_node("n2"), make_node("n3"))
    kept = KeptHosts()
    for spec in SHAPES:
        kept.hosts(log.state, job(spec))
    classes = kept.classes
    assert log(ev.NodeCordoned, node="n0").accepted
    assert log(ev.GpuHealthChanged, node="n2", gpu_index=0, healthy=False).accepted
    assert log(ev.NodeLost, node="n3").accepted
    for spec in SHAPES:
        nodes, names = kept.hosts(log.state, job(spec))
        fresh_nodes, fresh_names = find_hosts(log.state, job(spec))
        assert [n.name for n in nodes] == [n.name for n in fresh_nodes] and names == fresh_names
    assert kept.classes is classes
    assert [n.name for n in kept.hosts(log.state, job(SHAPES[1]))[0]] == ["n1"]   # 4 GPUs
    assert log(ev.NodeUncordoned, node="n0").accepted
    assert [n.name for n in kept.hosts(log.state, job(SHAPES[1]))[0]] == ["n0", "n1"]
    assert log(ev.NodeRegistered, node=make_node("n4")).accepted
    assert [n.name for n in kept.hosts(log.state, job(SHAPES[1]))[0]] == ["n0", "n1", "n4"]
    assert log(ev.NodeRegistered, node=make_node("n2", pool="other")).accepted   # a known node moves pool
    assert [n.name for n in kept.hosts(log.state, job(SHAPES[5]))[0]] == ["n2"]
    assert kept.classes is classes   # a registration moves its node, as a cordon does
