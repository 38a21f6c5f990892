"""The broker watch's words: one warning at a loss, a reminder a minute with how long, one
line when back; the client's errors held back meanwhile, its other words let through."""
from __future__ import annotations

import logging

from gpusched.adapters.broker.broker_watch import BrokerWatch


def _record(message: str, level: int = logging.ERROR, name: str = "aiokafka") -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, message, None, None)


LOST = "Unable connect to node with id 1: [Errno 111] Connect call failed ('127.0.0.1', 9092)"


def test_a_loss_is_one_warning_then_a_reminder_a_minute_then_one_line_back(caplog):
    now = [0.0]
    watch = BrokerWatch("127.0.0.1:9092", repeat_s=60.0, quiet_s=3.0, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, "gpusched.broker"):
        for i in range(240):   # two minutes of the client's errors, two a second
            now[0] = i / 2
            assert watch.filter(_record("Unable to update metadata from [1]" if i % 2 else LOST)) is False
        assert watch.back_if(reachable=True) is False          # the client spoke just now
        now[0] = 125.0
        assert watch.back_if(reachable=False) is False         # nothing answers yet
        assert watch.back_if(reachable=True) is True
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in lines] == ["WARNING", "WARNING", "INFO"], lines
    assert lines[0][1].startswith("broker unreachable at 127.0.0.1:9092; retrying (Unable connect to node")
    assert lines[1][1].startswith("broker still unreachable at 127.0.0.1:9092 after 1m 00s; retrying")
    assert lines[2][1] == "broker at 127.0.0.1:9092 reachable again after 2m 05s (240 client errors held back)"
    assert watch.down_since is None and watch.held_back == 0


def test_other_words_of_the_client_pass_and_a_coordinator_not_ready_is_no_loss(caplog):
    watch = BrokerWatch("b:9092")
    assert watch.filter(_record("Authenticated as placer", logging.INFO)) is True
    assert watch.filter(_record("Group Coordinator Request failed: [Error 15] GroupCoordinatorNotAvailableError")) is True
    assert watch.down_since is None
    assert watch.filter(_record(LOST)) is False and watch.down_since is not None
    # while it is away, the rest is held back too, and its own info lines still pass
    assert watch.filter(_record("Failed fetch messages from 1: NodeNotReadyError")) is False
    assert watch.filter(_record("Discovered coordinator 1", logging.INFO)) is True
