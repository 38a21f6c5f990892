"""The permission table and role bindings (gpusched.adapters.api.permissions), table-driven."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpusched.adapters.api import permissions as perm
from gpusched.adapters.api.permissions import METHODS, Policy, PolicyError
from gpusched.v1 import admission_pb2, cluster_pb2, node_agent_pb2

POLICY = Policy.from_dict({"bindings": [
    {"principal": "alice", "role": "member", "team": "a"},
    {"principal": "lead", "role": "team-admin", "team": "a"},
    {"principal": "multi", "role": "member", "team": "a"},
    {"principal": "multi", "role": "member", "team": "b"},
    {"principal": "ops", "role": "operator"},
    {"principal": "viewer", "role": "read-only"},
]})

A = "/gpusched.v1.AdmissionService/"
C = "/gpusched.v1.ClusterService/"
N = "/gpusched.v1.NodeAgentService/"

# (principal, method, team or None for "some team", allowed?)
CASES = [
    ("alice", A + "SubmitJob", "a", True),
    ("alice", A + "SubmitJob", "b", False),
    ("alice", A + "SubmitJobs", None, True),
    ("alice", A + "CancelJob", "a", True),
    ("alice", A + "CancelJob", "b", False),
    ("alice", A + "GetJob", "b", False),
    ("alice", A + "ListJobs", None, True),
    ("alice", A + "WatchJobs", "a", True),
    ("alice", C + "ListNodes", None, True),
    ("alice", C + "GetPoolSummary", None, True),
    ("alice", C + "CordonNode", None, False),
    ("alice", C + "UncordonNode", None, False),
    ("alice", C + "SetPoolTimeLimits", None, False),
    ("alice", C + "SetPoolTopology", None, False),
    ("alice", N + "InjectGpuFault", None, False),
    ("alice", N + "GetInventory", None, True),
    ("lead", A + "CancelJob", "a", True),
    ("lead", A + "CancelJob", "b", False),
    ("lead", C + "CordonNode", None, False),
    ("multi", A + "SubmitJob", "b", True),
    ("multi", A + "SubmitJob", "c", False),
    ("ops", A + "SubmitJob", "any-team", True),
    ("ops", A + "CancelJob", "any-team", True),
    ("ops", C + "CordonNode", None, True),
    ("ops", C + "SetPoolTimeLimits", None, True),
    ("ops", C + "SetPoolTopology", None, True),
    ("ops", N + "InjectGpuFault", None, True),
    ("viewer", A + "ListJobs", "any-team", True),
    ("viewer", A + "GetJob", "any-team", True),
    ("viewer", A + "SubmitJob", None, False),
    ("viewer", A + "CancelJob", "any-team", False),
    ("viewer", C + "CordonNode", None, False),
    ("alice", C + "SetQuota", None, False),
    ("alice", C + "SetTeamPolicy", None, False),
    ("alice", C + "GetPolicy", None, True),
    ("alice", C + "CreatePool", None, False),
    ("lead", C + "SetQuota", "a", True),         # its team's, within its org's (the handler's check)
    ("lead", C + "SetQuota", "b", False),
    ("lead", C + "SetTeamPolicy", None, False),  # weights and allow-lists are the cluster's
    ("lead", C + "CreatePool", None, False),
    ("ops", C + "SetQuota", "any-team", True),
    ("ops", C + "SetTeamPolicy", None, True),
    ("ops", C + "CreatePool", None, True),
    ("viewer", C + "GetPolicy", None, True),
    ("viewer", C + "SetQuota", None, False),
    ("stranger", C + "GetPolicy", None, False),
    ("stranger", A + "ListJobs", None, False),
    ("stranger", C + "ListNodes", None, False),
    ("stranger", "/grpc.health.v1.Health/Check", None, True),
]


@pytest.mark.parametrize("principal,method,team,allowed", CASES)
def test_permission_table(principal, method, team, allowed):
    assert POLICY.access(principal).allows(METHODS[method], team) is allowed


def test_every_rpc_of_every_service_has_an_entry():
    for module, service in ((admission_pb2, "AdmissionService"), (cluster_pb2, "ClusterService"),
                            (node_agent_pb2, "NodeAgentService")):
        for method in module.DESCRIPTOR.services_by_name[service].methods:
            assert f"/gpusched.v1.{service}/{method.name}" in METHODS


def test_the_docs_list_every_rpc_with_who_may_call_it_as_the_code_has_it():
    """docs/reference/security.md's table is ``permission_table()``'s output, between its markers."""
    text = (Path(__file__).resolve().parents[3] / "docs" / "reference" / "security.md").read_text()
    begin, end = "<!-- permission table: python -m gpusched.adapters.api.permissions -->\n", "<!-- end of the table -->"
    assert begin in text and end in text, "docs/reference/security.md lacks the generated permission table"
    assert text.split(begin, 1)[1].split(end, 1)[0] == perm.permission_table()
    for rpc in METHODS:
        assert f"`{rpc.removeprefix('/').removeprefix('gpusched.v1.')}`" in perm.permission_table()


def test_reads_are_filtered_to_the_principals_teams():
    assert POLICY.access("alice").teams_for(perm.READ_JOBS) == {"a"}
    assert POLICY.access("multi").teams_for(perm.READ_JOBS) == {"a", "b"}
    assert POLICY.access("viewer").teams_for(perm.READ_JOBS) is None
    assert POLICY.access("ops").teams_for(perm.CANCEL) is None
    assert POLICY.access("viewer").teams_for(perm.SUBMIT) == frozenset()
    assert POLICY.access("stranger").teams_for(perm.READ_JOBS) == frozenset()
    # reading the cluster (nodes, pools) is not per team: any role grants all of it
    assert POLICY.access("alice").teams_for(perm.READ_CLUSTER) is None
    assert POLICY.access("alice").allows(perm.READ_CLUSTER, "b")


def test_default_team_only_when_exactly_one():
    assert POLICY.access("alice").default_team() == "a"
    assert POLICY.access("multi").default_team() is None
    assert POLICY.access("ops").default_team() is None
    assert POLICY.access("viewer").default_team() is None


def test_a_member_cancels_its_own_jobs_a_team_admin_any_of_the_team():
    assert not POLICY.access("alice").allows(perm.CANCEL_ANY, "a")
    assert POLICY.access("lead").allows(perm.CANCEL_ANY, "a")
    assert not POLICY.access("lead").allows(perm.CANCEL_ANY, "b")
    assert POLICY.access("ops").allows(perm.CANCEL_ANY, "any-team")
    assert not POLICY.access("viewer").allows(perm.CANCEL_ANY, "a")


def test_team_settings_are_the_team_admins_not_the_members():
    assert POLICY.access("lead").allows(perm.TEAM_SETTINGS, "a")
    assert not POLICY.access("lead").allows(perm.TEAM_SETTINGS, "b")
    assert not POLICY.access("alice").allows(perm.TEAM_SETTINGS, "a")


BAD_POLICIES = [
    ({}, "bindings"),
    ({"bindings": [{"principal": "x", "role": "admin"}]}, "bindings[0].role"),
    ({"bindings": [{"principal": "", "role": "operator"}]}, "bindings[0].principal"),
    ({"bindings": [{"principal": "x", "role": "member"}]}, "bindings[0].team"),
    ({"bindings": [{"principal": "x", "role": "operator", "team": "a"}]}, "bindings[0].team"),
    ({"bindings": [{"principal": "x", "role": "operator", "teams": ["a"]}]}, "bindings[0]"),
]


@pytest.mark.parametrize("data,field", BAD_POLICIES)
def test_bad_policy_names_the_entry(data, field):
    with pytest.raises(PolicyError, match=field.replace("[", r"\[").replace("]", r"\]")):
        Policy.from_dict(data)


def test_policy_file(tmp_path):
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"bindings": [{"principal": "ops", "role": "operator"}]}))
    assert Policy.from_file(path).access("ops").allows(perm.WRITE_NODES)
    path.write_text("{not json")
    with pytest.raises(PolicyError, match="policy.json"):
        Policy.from_file(path)
