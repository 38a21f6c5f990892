"""The ``gpusched`` command group: connection options, one client per invocation, and
API errors printed as one line (``NOT_FOUND: job-...``), never a traceback."""
from __future__ import annotations

import functools
import signal

import grpc
import click

from gpusched.client import SyncClient
from gpusched.ctl.config import resolve
from gpusched.ctl.jobfile import JobFileError
from gpusched.ctl.output import printable

INTERRUPTED = 128 + int(signal.SIGINT)   # the exit status of a command Ctrl-C ended, as shells report it


class State:
    def __init__(self, flags: dict[str, str | None], config: str | None, context: str | None) -> None:
        self.flags, self.config, self.context = flags, config, context
        self._client: SyncClient | None = None

    def client(self) -> SyncClient:
        if self._client is None:
            self._client = resolve(self.flags, self.config, self.context).connect()
            click.get_current_context().call_on_close(self._client.close)
        return self._client


class Root(click.Group):
    """``services``: the names listed apart in the help, after the user commands."""

    services: frozenset[str] = frozenset()

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = {False: [], True: []}
        for name in self.list_commands(ctx):
            rows[name in self.services].append((name, self.get_command(ctx, name).get_short_help_str(70)))
        for title, is_service in (("Commands", False), ("Services and tools", True)):
            if rows[is_service]:
                with formatter.section(title):
                    formatter.write_dl(rows[is_service])

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except grpc.aio.AioRpcError as exc:
            raise click.ClickException(printable(f"{exc.code().name}: {exc.details()}")) from None
        except JobFileError as exc:
            raise click.ClickException(printable(str(exc))) from None
        except KeyboardInterrupt:   # Ctrl-C (a watch that follows until interrupted): quietly, as a shell expects
            ctx.exit(INTERRUPTED)


def connection_options(f):
    for option in reversed([
        click.option("--endpoint", envvar="GPUSCHED_ENDPOINT", help="admission's host:port [127.0.0.1:50051]"),
        click.option("--context", envvar="GPUSCHED_CONTEXT", help="a context of the config file"),
        click.option("--config", "config_path", envvar="GPUSCHED_CONFIG",
                     help="config file [~/.config/gpusched/config.yaml]"),
        click.option("--ca", envvar="GPUSCHED_CA", help="CA of the server's certificate (PEM): TLS"),
        click.option("--cert", envvar="GPUSCHED_CERT", help="client certificate (PEM): mutual TLS"),
        click.option("--key", envvar="GPUSCHED_KEY", help="client private key (PEM)"),
        click.option("--token", envvar="GPUSCHED_TOKEN", help="bearer token (needs TLS)"),
        click.option("--token-file", envvar="GPUSCHED_CLIENT_TOKEN_FILE", help="a file holding the bearer token"),
    ]):
        f = option(f)
    return f


def pass_client(f):
    """Hands the command a connected ``SyncClient`` as its first argument."""
    @click.pass_context
    def wrapper(ctx: click.Context, *args, **kwargs):
        return ctx.invoke(f, ctx.find_object(State).client(), *args, **kwargs)
    return functools.update_wrapper(wrapper, f)
