"""``gpusched dashboard``: the command that starts the dashboard, connected as the other
commands are (``--endpoint``, TLS and token options, or the config file's context)."""
from __future__ import annotations

import logging

import click

from gpusched.client import Client, ClientTls, Retry
from gpusched.ctl.config import resolve
from gpusched.ctl.root import State
from gpusched.dashboard.server import Settings, serve

# a page waits for its calls: give up on an unavailable admission well within a request
DASHBOARD_RETRY = Retry(budget_s=5.0)


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise click.BadParameter(f"expected host:port, got {value!r}", param_hint="--listen")
    return host or "127.0.0.1", int(port)


@click.command()
@click.option("--listen", default="127.0.0.1:8080", show_default=True,
              help="host:port of the web page (port 0: a free one, printed at start)")
@click.option("--interval", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="seconds between the samples of the pools' charts")
@click.option("--history", type=click.IntRange(min=2), default=720, show_default=True,
              help="samples kept per pool")
@click.option("--refresh", type=click.IntRange(min=0), default=10, show_default=True,
              help="seconds after which the overview reloads itself (0: never)")
@click.pass_context
def dashboard(ctx: click.Context, listen: str, interval: float, history: int, refresh: int) -> None:
    """A read-only web page of the cluster: pools over time, a GPU grid, queues, jobs."""
    address = parse_listen(listen)
    state = ctx.find_object(State)
    endpoint = resolve(state.flags, state.config, state.context)
    if endpoint.token and not endpoint.ca:
        raise click.UsageError("a token needs TLS: give --ca (or ca: in the context)")
    tls = ClientTls.from_files(endpoint.ca, endpoint.cert or None, endpoint.key or None) if endpoint.ca else None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    serve(address, Settings(endpoint.endpoint, interval, history, refresh),
          lambda: Client(endpoint.endpoint, tls, endpoint.token, DASHBOARD_RETRY),
          ready=lambda line: click.echo(line))
