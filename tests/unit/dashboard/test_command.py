"""``gpusched dashboard``'s options: bad values are refused with the option named."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from gpusched.cli import cli


@pytest.mark.parametrize("args, message", [
    (["--listen", "8080"], "Invalid value for --listen: expected host:port, got '8080'"),
    (["--listen", "host:http"], "Invalid value for --listen: expected host:port, got 'host:http'"),
    (["--listen", "host:70000"], "Invalid value for --listen"),
    (["--interval", "0"], "Invalid value for '--interval'"),
    (["--history", "1"], "Invalid value for '--history'"),
])
def test_bad_options_are_refused(args, message):
    result = CliRunner().invoke(cli, ["dashboard", *args])
    assert result.exit_code == 2 and message in result.output, result.output


def test_listed_with_the_user_commands():
    out = CliRunner().invoke(cli, ["--help"]).output
    assert "  dashboard " in out.split("Commands:")[1].split("Services and tools:")[0]
