"""A broker lost while a service runs, said the way an operator can read it: one warning
when it goes ("broker unreachable at X; retrying"), a reminder a minute with how long,
and one line when it is back; not the Kafka client's reconnect errors, several a second
from every consumer and producer, for as long as it is away.

The Kafka client (aiokafka) reconnects by itself; only its logging is in the way. A filter
on its loggers takes its first connection error as the loss and holds back everything it
logs at WARNING or above while the broker is away (counted, and the count said). The
broker is back once a TCP connection to it opens and the client has logged no error for
``quiet_s``: its own reconnections then went through."""
from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Callable

log = logging.getLogger("gpusched.broker")

# What the client logs when a connection to a broker fails (aiokafka: conn, client,
# fetcher). Not a group coordinator that is not ready yet (usual while a group forms):
# only a failed connection starts a loss; while it lasts, everything is held back.
_LOST = re.compile(r"Unable connect|Connect call failed|Unable to bootstrap|Connection at \S+ closed|"
                   r"Connection reset")


def took(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m {seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class BrokerWatch(logging.Filter):
    """The filter on the client's loggers, and what the service says."""

    def __init__(self, where: str, repeat_s: float = 60.0, quiet_s: float = 3.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.where = where
        self.repeat_s = repeat_s
        self.quiet_s = quiet_s
        self._clock = clock
        self.down_since: float | None = None
        self._last_error = 0.0
        self._last_said = 0.0
        self.held_back = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        if self.down_since is None and not _LOST.search(record.getMessage()):
            return True   # not about reaching the broker: the client's own words
        self._lost(record.getMessage())
        return False

    def _lost(self, message: str) -> None:
        now = self._clock()
        self._last_error = now
        self.held_back += 1
        if self.down_since is None:
            self.down_since = self._last_said = now
            log.warning("broker unreachable at %s; retrying (%s; the Kafka client's errors are held back until "
                        "it is back)", self.where, message[:200])
        elif now - self._last_said >= self.repeat_s:
            self._last_said = now
            log.warning("broker still unreachable at %s after %s; retrying (%d client errors held back)",
                        self.where, took(now - self.down_since), self.held_back)

    def back_if(self, reachable: bool) -> bool:
        """Says the broker is back when it answers and the client has gone quiet."""
        now = self._clock()
        if self.down_since is None or not reachable or now - self._last_error < self.quiet_s:
            return False
        log.info("broker at %s reachable again after %s (%d client errors held back)",
                 self.where, took(now - self.down_since), self.held_back)
        self.down_since, self.held_back = None, 0
        return True


def _client_loggers() -> list[logging.Logger]:
    """aiokafka's loggers: a filter on a logger sees only what is logged on it, not on its
    children, so each gets the filter."""
    names = [name for name in logging.Logger.manager.loggerDict if name == "aiokafka" or name.startswith("aiokafka.")]
    return [logging.getLogger(name) for name in ["aiokafka", *names]]


async def _reachable(hosts: list[tuple[str, int]], timeout: float = 1.0) -> bool:
    for host, port in hosts:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        except (OSError, asyncio.TimeoutError):
            continue
        writer.close()
        return True
    return False


def _hosts(bootstrap: str) -> list[tuple[str, int]]:
    hosts = []
    for item in bootstrap.split(","):
        host, _, port = item.strip().rpartition(":")
        if host and port.isdigit():
            hosts.append((host.strip("[]"), int(port)))
    return hosts


_TASKS: set[asyncio.Task] = set()   # the loop keeps only weak references to tasks


def watch_broker(bootstrap: str, check_s: float = 1.0) -> asyncio.Task:
    """Installs the watch on the client's loggers; the task says when the broker is back.
    It runs for the life of the service."""
    watch = BrokerWatch(bootstrap)
    for logger in _client_loggers():
        logger.addFilter(watch)
    hosts = _hosts(bootstrap)

    async def run() -> None:
        while True:
            await asyncio.sleep(check_s)
            if watch.down_since is not None:
                watch.back_if(await _reachable(hosts))

    task = asyncio.get_running_loop().create_task(run(), name="broker-watch")
    _TASKS.add(task)
    task.add_done_callback(_TASKS.discard)
    return task
