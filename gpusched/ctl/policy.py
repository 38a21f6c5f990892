"""``gpusched policy``: read and set quotas, weights and allow-lists through admission's
ClusterService (docs/reference/policy.md). Prints the policy the log holds after the call."""
from __future__ import annotations

import click

from gpusched.client import SyncClient
from gpusched.ctl.output import as_dict, dump
from gpusched.ctl.root import State
from gpusched.v1 import cluster_pb2

_format = click.option("-o", "--output", type=click.Choice(["json", "yaml"]), default="json", show_default=True)


@click.group()
@click.option("--target", envvar="GPUSCHED_ADMISSION", hidden=True,
              help="admission's address (older name of the global --endpoint)")
@click.pass_context
def policy(ctx: click.Context, target: str | None) -> None:
    """Quotas, fair-share weights and allow-lists (operators; a team admin sets its own
    team's quota within its org's: docs/reference/policy.md, docs/reference/security.md)."""
    state = ctx.find_object(State)
    if target and not state.flags.get("endpoint"):
        state.flags["endpoint"] = target


def _client() -> SyncClient:
    return click.get_current_context().find_object(State).client()


@policy.command("get")
@_format
def get_policy(output: str) -> None:
    """The quotas and team policies the log holds."""
    dump(as_dict(_client().policy()), output)


@policy.command("set-quota")
@click.option("--org", default="")
@click.option("--team", default="", help="a team's quota ('*': the default for teams not named); none: the org's")
@click.option("--guaranteed", type=float, default=0.0, help="GPUs")
@click.option("--limit", type=float, help="GPUs (unset: none)")
@click.option("--no-borrowing", is_flag=True, help="never above the guarantee")
@click.option("--lending-limit", type=float, help="GPUs of the unused guarantee others may borrow")
@click.option("--weight", type=float, help="an org's fair-share weight")
@_format
def set_quota(org: str, team: str, guaranteed: float, limit: float | None, no_borrowing: bool,
              lending_limit: float | None, weight: float | None, output: str) -> None:
    """An org's quota (no --team) or a team's."""
    request = cluster_pb2.SetQuotaRequest(org=org, team=team, guaranteed_gpus=guaranteed)
    for name, value in (("limit_gpus", limit), ("lending_limit_gpus", lending_limit), ("weight", weight)):
        if value is not None:
            setattr(request, name, value)
    if no_borrowing:
        request.borrowing = False
    dump(as_dict(_client().set_quota(request)), output)


@policy.command("set-team")
@click.argument("team")
@click.option("--weight", type=float)
@click.option("--priority-class", multiple=True, help="repeat; none: every class")
@click.option("--pool", multiple=True, help="repeat; none: every pool")
@_format
def set_team(team: str, weight: float | None, priority_class: tuple[str, ...], pool: tuple[str, ...],
             output: str) -> None:
    """A team's weight and allow-lists ('*': the default)."""
    request = cluster_pb2.SetTeamPolicyRequest(team=team, priority_classes=priority_class, pools=pool)
    if weight is not None:
        request.weight = weight
    dump(as_dict(_client().set_team_policy(request)), output)
