"""QuotaSet and TeamPolicySet: the reducer folds valid policy, rejects bad values with a
reason naming the field, and snapshots and digests carry what it folded."""
from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.core.policy import NO_LIMIT, Quota, TeamPolicy
from gpusched.core.reducer import apply
from gpusched.core.snapshot import snapshot_bytes, state_from_snapshot
from gpusched.core.state import ClusterState
from tests.unit.core.builders import Log, make_node

FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def quota(org="ml", team="llm", g=2000, limit=NO_LIMIT, borrowing=True, lending=NO_LIMIT, weight=1.0) -> Quota:
    return Quota(org, team, g, limit, borrowing, lending, weight)


@pytest.mark.parametrize("q, reason", [
    (quota(g=-1), "guaranteed_milli"),
    (quota(limit=1000), "limit_milli: 1000 is below the guarantee"),
    (quota(limit=-2), "limit_milli"),
    (quota(lending=3000), "lending_limit_milli: 3000 is above the guarantee"),
    (quota(weight=0.0), "weight"),
    (quota(weight=math.nan), "weight"),
    (quota(weight=math.inf), "weight"),
    (quota(org="", team=""), "org: an org quota names its org"),
    (quota(org="ml", team="*"), "org: the default team quota"),
    (quota(g=10 ** 13), "guaranteed_milli"),
])
def test_bad_quota_is_rejected_naming_the_field(q, reason):
    state = ClusterState()
    out = apply(state, ev.QuotaSet(event_id="q", quota=q))
    assert not out.accepted and reason in out.reason
    assert state.team_quotas == {} and state.org_quotas == {} and state.policy_version == 0


@pytest.mark.parametrize("p, reason", [
    (TeamPolicy("", 1.0), "team: must not be empty"),
    (TeamPolicy("llm", 0.0), "weight"),
    (TeamPolicy("llm", -1.0), "weight"),
    (TeamPolicy("llm", 1.0, ("gold",)), "priority_classes: unknown ['gold']"),
    (TeamPolicy("llm", 1.0, ("training", "training")), "repeated"),
    (TeamPolicy("llm", 1.0, (), ("",)), "pools: an entry is empty"),
])
def test_bad_team_policy_is_rejected_naming_the_field(p, reason):
    state = ClusterState()
    out = apply(state, ev.TeamPolicySet(event_id="p", policy=p))
    assert not out.accepted and reason in out.reason
    assert state.team_policies == {}


def test_quotas_and_policies_fold_and_replace():
    state = ClusterState()
    assert apply(state, ev.QuotaSet(event_id="1", quota=quota(org="ml", team="", g=8000, weight=2.0))).accepted
    assert apply(state, ev.QuotaSet(event_id="2", quota=quota(team="llm", g=4000))).accepted
    assert apply(state, ev.QuotaSet(event_id="3", quota=quota(org="web", team="llm", g=1000))).accepted
    assert apply(state, ev.TeamPolicySet(event_id="4", policy=TeamPolicy("llm", 3.0, ("training",)))).accepted
    assert state.org_quotas == {"ml": quota(org="ml", team="", g=8000, weight=2.0)}
    assert state.team_quotas == {"llm": quota(org="web", team="llm", g=1000)}   # moved to web
    assert state.team_policies["llm"].weight == 3.0
    assert state.policy_version == 4


def test_snapshot_carries_policy_and_digest_covers_it():
    log = Log(make_node("n1"))
    before = digest(log.state)
    assert log(ev.QuotaSet, quota=quota()).accepted
    assert log(ev.TeamPolicySet, policy=TeamPolicy("llm", 2.0, ("training",), ("default",))).accepted
    assert digest(log.state) != before
    restored = state_from_snapshot(snapshot_bytes(log.state))
    assert restored.team_quotas == log.state.team_quotas
    assert restored.team_policies == log.state.team_policies
    assert restored.policy_version == log.state.policy_version
    assert digest(restored) == digest(log.state)
    # A different weight is a different digest: replicas that disagree on policy differ.
    other = Log(make_node("n1"))
    other(ev.QuotaSet, quota=quota())
    other(ev.TeamPolicySet, policy=TeamPolicy("llm", 3.0, ("training",), ("default",)))
    assert digest(other.state) != digest(log.state)


def test_digest_without_policy_is_unchanged_by_the_new_fields():
    # No policy event: the canonical form has no policy key (older digests stay valid).
    from gpusched.core.digest import canonical
    assert "policy" not in canonical(Log(make_node("n1")).state)


# --- properties -----------------------------------------------------------------------
names = st.sampled_from(["", "ml", "web", "llm", "search", "*"])
millis = st.one_of(st.just(NO_LIMIT), st.integers(-5, 20_000), st.integers(-(2 ** 40), 2 ** 40))
weights = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.5, 1.0, 2.0]))
quotas = st.builds(Quota, org=names, team=names, guaranteed_milli=millis, limit_milli=millis,
                   borrowing=st.booleans(), lending_limit_milli=millis, weight=weights)
classes = st.lists(st.sampled_from(["training", "best-effort", "production-inference", "gold"]), max_size=3)
policies = st.builds(TeamPolicy, team=names, weight=weights, priority_classes=classes.map(tuple),
                     pools=st.lists(st.sampled_from(["", "a", "b"]), max_size=2).map(tuple))
policy_events = st.lists(st.one_of(quotas.map(lambda q: ("q", q)), policies.map(lambda p: ("p", p))), max_size=12)


def _events(items) -> list[ev.Event]:
    return [ev.QuotaSet(event_id=f"e{i}", time=float(i), quota=x) if kind == "q" else
            ev.TeamPolicySet(event_id=f"e{i}", time=float(i), policy=x) for i, (kind, x) in enumerate(items)]


@FAST
@given(policy_events)
def test_folded_policy_holds_only_valid_values(items):
    state = ClusterState()
    for e in _events(items):
        apply(state, e)
    for q in [*state.org_quotas.values(), *state.team_quotas.values()]:
        assert 0 <= q.guaranteed_milli and 0.0 < q.weight < math.inf
        assert q.limit_milli == NO_LIMIT or q.limit_milli >= q.guaranteed_milli
        assert q.lending_limit_milli == NO_LIMIT or 0 <= q.lending_limit_milli <= q.guaranteed_milli
    for p in state.team_policies.values():
        assert p.team and 0.0 < p.weight < math.inf and "gold" not in p.priority_classes


@FAST
@given(policy_events, st.integers(0, 12))
def test_replays_agree_by_digest_also_from_a_snapshot(items, cut):
    events = _events(items)
    first, second = ClusterState(), ClusterState()
    for e in events:
        apply(first, e)
    for e in events[:cut]:
        apply(second, e)
    second = state_from_snapshot(snapshot_bytes(second))
    for e in events[cut:]:
        apply(second, e)
    assert digest(first) == digest(second)
    assert (first.team_quotas, first.org_quotas, first.team_policies) == \
        (second.team_quotas, second.org_quotas, second.team_policies)


@pytest.mark.parametrize("team, priority_class, pool, field", [
    ("interns", "production-inference", "default", "spec.priority_class"),
    ("interns", "best-effort", "other", "spec.pool"),
    ("anyone", "training", "other", "spec.pool"),         # the default team's policy
    ("interns", "best-effort", "default", ""),
    ("anyone", "training", "default", ""),
])
def test_the_fold_enforces_allow_lists_on_submitted_jobs(team, priority_class, pool, field):
    from tests.unit.core.builders import make_spec
    log = Log(make_node("n1"))
    assert log(ev.TeamPolicySet, policy=TeamPolicy("interns", 1.0, ("best-effort",), ("default",))).accepted
    assert log(ev.TeamPolicySet, policy=TeamPolicy("*", 1.0, (), ("default",))).accepted
    out = log.submit("j", make_spec(team, priority_class=priority_class, pool=pool))
    assert out.accepted == (not field)
    if field:
        assert out.reason.startswith(field) and "j" not in log.state.jobs


def test_without_team_policies_every_class_and_pool_is_allowed():
    from tests.unit.core.builders import make_spec
    log = Log(make_node("n1"))
    assert log(ev.PoolCreated, pool="other").accepted
    assert log.submit("j", make_spec("anyone", priority_class="production-inference", pool="other")).accepted
