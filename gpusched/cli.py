"""``gpusched <command>``: the user and operator commands (gpusched.ctl, docs/reference/cli.md) and
one entry point for the services, the demo and the simulator."""
from __future__ import annotations

import sys

import click

from gpusched.commands import COMMANDS, run
from gpusched.ctl.decode import decode
from gpusched.ctl.jobs import cancel, describe, get, submit, watch
from gpusched.ctl.nodes import cordon, top, uncordon
from gpusched.ctl.policy import policy
from gpusched.ctl.pools import pool
from gpusched.ctl.root import Root, State, connection_options
from gpusched.ctl.services import apply, delete, lb, rollout, scale
from gpusched.ctl.version import version
from gpusched.dashboard.command import dashboard


def _handed_on(name: str, help_text: str) -> click.Command:
    """A service or tool with a parser of its own: its arguments are handed on as given."""
    @click.command(name, help=f"{help_text} (`gpusched {name} --help`)", short_help=help_text,
                   add_help_option=False, context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def handed_on(args: tuple[str, ...]) -> None:
        sys.exit(run(name, list(args)))
    return handed_on


@click.group(cls=Root, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@connection_options
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, context: str | None, **flags: str | None) -> None:
    """gpusched: an event-sourced GPU cluster scheduler. The API's endpoint and credentials
    come from the options, GPUSCHED_* variables, or the current context of
    ~/.config/gpusched/config.yaml (docs/reference/cli.md)."""
    ctx.obj = State(flags, config_path, context)


for command in (submit, apply, get, describe, cancel, scale, delete, rollout, lb, watch, top, cordon, uncordon, pool, policy, dashboard, decode, version):
    cli.add_command(command)
for name, command in COMMANDS.items():
    cli.add_command(_handed_on(name, command.help))
cli.services = frozenset(COMMANDS)


def main(argv: list[str] | None = None) -> int:
    return cli.main(args=argv, prog_name="gpusched", standalone_mode=True) or 0


if __name__ == "__main__":
    sys.exit(main())
