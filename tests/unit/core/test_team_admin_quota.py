"""What a team admin may set of its own team's quota (gpusched.core.policy.team_quota_within_org):
within its org's quota, table-driven; hypothesis: whatever a team admin sets that the rule
allows, the org's teams' guarantees stay within the org's and their limits within its limit."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.policy import NO_LIMIT, Quota, check_quota, team_quota_within_org

ORGS = {"ml": Quota("ml", "", guaranteed_milli=16_000, limit_milli=24_000),
        "open": Quota("open", "", guaranteed_milli=8_000)}
TEAMS = {"llm": Quota("ml", "llm", 8_000, 12_000), "vision": Quota("ml", "vision", 4_000, 8_000),
         "web": Quota("open", "web", 2_000), "loner": Quota("", "loner", 1_000),
         "orphan": Quota("gone", "orphan", 1_000)}

CASES = [
    # (quota asked, the field refused or "" when allowed)
    (Quota("ml", "llm", 12_000, 24_000), ""),                   # up to what the org has left, and its limit
    (Quota("ml", "llm", 0, 1_000, borrowing=False), ""),
    (Quota("ml", "llm", 8_000, 12_000, lending_limit_milli=2_000), ""),
    (Quota("ml", "llm", 12_001, 24_000), "guaranteed_milli"),   # 12.001 + vision's 4 > 16
    (Quota("ml", "llm", 8_000, 24_001), "limit_milli"),         # above the org's limit
    (Quota("ml", "llm", 8_000), "limit_milli"),                 # no limit at all: above it too
    (Quota("open", "web", 8_000), ""),                          # the org has no limit
    (Quota("open", "web", 8_001), "guaranteed_milli"),
    (Quota("open", "llm", 1_000, 2_000), "org"),                # moving the team to another org
    (Quota("", "llm", 1_000, 2_000), "org"),
    (Quota("", "loner", 1_000), "org"),                         # in no org: nothing to stay within
    (Quota("gone", "orphan", 1_000), "org"),                    # its org has no quota of its own
    (Quota("ml", "newcomer", 1_000, 2_000), "org"),             # not in the log yet
    (Quota("ml", "", 16_000), "team"),                          # the org's own quota
    (Quota("", "*", 1_000), "team"),                            # the default team's
]


@pytest.mark.parametrize("quota, field", CASES, ids=[f"{q.org}/{q.team}-{q.guaranteed_milli}" for q, _ in CASES])
def test_a_team_admin_sets_its_teams_quota_within_its_orgs(quota, field):
    assert check_quota(quota) == ""
    problem = team_quota_within_org(quota, TEAMS, ORGS)
    assert problem.partition(":")[0] == field, problem


_MILLI = st.integers(0, 40_000)


@st.composite
def org_and_teams(draw):
    """An org with a quota, and teams within it as an operator set them."""
    guaranteed = draw(_MILLI)
    limit = draw(st.one_of(st.just(NO_LIMIT), st.integers(guaranteed, 60_000)))
    org = Quota("org", "", guaranteed, limit)
    teams, left = {}, guaranteed
    for i in range(draw(st.integers(1, 4))):
        share = draw(st.integers(0, left))
        left -= share
        team_limit = draw(st.integers(share, limit)) if limit != NO_LIMIT else NO_LIMIT
        teams[f"t{i}"] = Quota("org", f"t{i}", share, team_limit)
    return org, teams


@settings(max_examples=300, deadline=None)
@given(start=org_and_teams(), changes=st.lists(st.tuples(st.integers(0, 3), _MILLI,
                                                       st.one_of(st.just(NO_LIMIT), _MILLI)), max_size=12))
def test_whatever_team_admins_set_the_org_keeps_its_bounds(start, changes):
    org, teams = start
    for i, guaranteed, limit in changes:
        team = f"t{i}"
        if team not in teams:
            continue
        quota = Quota("org", team, guaranteed, limit)
        if check_quota(quota) or team_quota_within_org(quota, teams, {"org": org}):
            continue   # refused: the admin's call changes nothing
        teams[team] = quota
    assert sum(q.guaranteed_milli for q in teams.values()) <= org.guaranteed_milli
    if org.limit_milli != NO_LIMIT:
        assert all(0 <= q.limit_milli <= org.limit_milli for q in teams.values())
