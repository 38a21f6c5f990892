"""The command tree: user commands and the services' entry points, which get their
arguments as given."""
from __future__ import annotations

from click.testing import CliRunner

from gpusched.cli import COMMANDS, cli


def test_help_lists_user_commands_then_services():
    out = CliRunner().invoke(cli, ["--help"]).output
    commands, services = out.split("Commands:")[1].split("Services and tools:")
    assert all(f"  {name} " in commands for name in ("submit", "get", "describe", "cancel", "watch", "top",
                                                   "cordon", "uncordon", "policy"))
    assert all(f"  {name} " in services for name in COMMANDS)


def test_a_service_command_gets_its_arguments_as_given():
    # gpusched usage's own parser refuses the value: its message, its exit status
    result = CliRunner().invoke(cli, ["usage", "--idle-after", "-1"])
    assert result.exit_code == 2 and "'-1' is not a number > 0" in result.output
    result = CliRunner().invoke(cli, ["simulate", "--help"])
    assert result.exit_code == 0 and "gpusched simulate <kind>" in result.output


def test_describe_and_tables_say_why_a_pending_job_waits():
    from gpusched.ctl.jobs import job_lines, why
    from gpusched.v1 import types_pb2

    summary = "0/3 nodes are available: 2 not enough free GPUs, 1 cordoned."
    job = types_pb2.Job(job_id="j", phase=types_pb2.JOB_PHASE_PENDING, reason="GPU n/3 unhealthy",
                        pending=types_pb2.PendingReason(kind=types_pb2.PENDING_KIND_NO_FIT, summary=summary))
    job.pending_at.FromSeconds(1_700_000_000)
    lines = job_lines(job)
    assert f"Why pending:  {summary}" in lines and "Reason:       GPU n/3 unhealthy" in lines
    assert any(line.strip().startswith("(no_fit, found ") for line in lines)
    assert why(job) == summary
    job.phase = types_pb2.JOB_PHASE_RUNNING   # a reason from before it was placed is not shown
    assert not any("Why pending" in line for line in job_lines(job)) and why(job) == "GPU n/3 unhealthy"
