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
