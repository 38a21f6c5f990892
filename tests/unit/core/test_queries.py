"""What a GPU's allocation counts (gpusched.core.queries): one rule, a job's usage
(``WorkerResources.milli``): a MIG slice counts its compute slices in sevenths, whatever
memory slices it holds; the pool summary and every node's GPUs add up to the teams' usage."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.queries import gpus_allocated_milli, pool_summary
from tests.unit.core.builders import Log, make_node, make_spec, mig, share, whole


def test_a_mig_slice_counts_its_compute_sevenths_as_a_jobs_usage_does():
    log = Log(make_node("n1", 4))
    log.submit("sliced", make_spec(mig="3g", team="vision"))      # 3 of 7 compute, 4 of 8 memory slices
    log.place("sliced", ("n1", mig(2, "3g", 0)))
    log.submit("small", make_spec(mig="1g", team="vision"))
    log.place("small", ("n1", mig(2, "1g", 4)))
    log.submit("quarter", make_spec(milli=250, team="nlp"))
    log.place("quarter", ("n1", share(1, 250)))
    log.submit("whole", make_spec(gpus=1, team="nlp"))
    log.place("whole", ("n1", whole(0)))
    assert gpus_allocated_milli(log.state, log.node("n1")) == [1000, 250, 428 + 142, 0]
    assert pool_summary(log.state, "default").gpu_milli_allocated == 1820
    assert log.state.usage["vision"].gpu_milli == 570 and log.state.usage["nlp"].gpu_milli == 1250


SHAPES = {"whole": (dict(gpus=1), lambda g, s: whole(g)), "share": (dict(milli=300), lambda g, s: share(g, 300)),
          "1g": (dict(mig="1g"), lambda g, s: mig(g, "1g", s)), "2g": (dict(mig="2g"), lambda g, s: mig(g, "2g", s)),
          "3g": (dict(mig="3g"), lambda g, s: mig(g, "3g", s)), "7g": (dict(mig="7g"), lambda g, s: mig(g, "7g", s))}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(SHAPES)), st.integers(0, 1), st.sampled_from([0, 2, 4, 6]),
                          st.sampled_from(["team-a", "team-b"]), st.booleans()), max_size=16))
def test_the_nodes_allocations_add_up_to_the_teams_usage(steps):
    """Whatever was placed and ended, every node's GPUs together hold what the teams are charged."""
    log = Log(make_node("n1", 2), make_node("n2", 2))
    for i, (shape, gpu, start, team, end) in enumerate(steps):
        kw, slots = SHAPES[shape]
        job = f"j{i}"
        log.submit(job, make_spec(team=team, **kw))
        log.place(job, ("n1" if i % 2 else "n2", slots(gpu, start)))
        if end and log.job(job).phase.holds_gpus:
            log(ev.JobCancelled, job_id=job)
            for w in log.job(job).workers:
                log.finish(job, w.worker, 0)
    state = log.state
    allocated = sum(sum(gpus_allocated_milli(state, node)) for node in state.nodes.values())
    assert allocated == sum(usage.gpu_milli for usage in state.usage.values())
    assert pool_summary(state, "default").gpu_milli_allocated == allocated
