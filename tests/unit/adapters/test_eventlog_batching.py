"""Fetch batching of the log follower: the switch on the record rate, and the aiokafka
internals it relies on (pinned version; this fails loudly if they change)."""
from __future__ import annotations

import inspect

from aiokafka.consumer.fetcher import Fetcher

from gpusched.adapters import eventlog
from gpusched.adapters.eventlog import (
    BUSY_FETCH_MIN_BYTES, BUSY_FETCH_WAIT_MS, BUSY_RECORDS_PER_S, IDLE_FETCH_WAIT_MS, RATE_WINDOW_S,
    LogFollower, set_fetch_batching,
)


class _Fetcher:
    _fetch_min_bytes = 1
    _fetch_max_wait_ms = IDLE_FETCH_WAIT_MS


class _Consumer:
    def __init__(self) -> None:
        self._fetcher = _Fetcher()


def test_aiokafka_builds_fetch_requests_from_the_attributes_we_set():
    source = inspect.getsource(Fetcher._get_actions_per_node)
    assert "self._fetch_max_wait_ms" in source and "self._fetch_min_bytes" in source
    init = inspect.getsource(Fetcher.__init__)
    assert "self._fetch_min_bytes = fetch_min_bytes" in init
    assert "self._fetch_max_wait_ms = fetch_max_wait_ms" in init


def test_set_fetch_batching_switches_both_ways():
    consumer = _Consumer()
    set_fetch_batching(consumer, True)
    assert (consumer._fetcher._fetch_min_bytes, consumer._fetcher._fetch_max_wait_ms) == \
        (BUSY_FETCH_MIN_BYTES, BUSY_FETCH_WAIT_MS)
    set_fetch_batching(consumer, False)
    assert (consumer._fetcher._fetch_min_bytes, consumer._fetcher._fetch_max_wait_ms) == (1, IDLE_FETCH_WAIT_MS)


def _follower(clock: list[float]) -> LogFollower:
    follower = LogFollower("127.0.0.1:1", eventlog.TopicNames("t."), "t", dead_letters=None)
    follower._consumer = _Consumer()
    follower._window = (clock[0], 0)
    return follower


def test_rate_above_the_threshold_turns_batching_on_and_a_quiet_window_turns_it_off(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(eventlog.time, "monotonic", lambda: clock[0])
    follower = _follower(clock)
    # a window's worth of records at twice the threshold rate, in small batches
    per_batch = int(2 * BUSY_RECORDS_PER_S * RATE_WINDOW_S / 10)
    for _ in range(11):
        clock[0] += RATE_WINDOW_S / 10
        follower._measure_rate(per_batch)
    assert follower.busy
    assert follower._consumer._fetcher._fetch_max_wait_ms == BUSY_FETCH_WAIT_MS
    # then a slow trickle: below the threshold over the next window
    for _ in range(11):
        clock[0] += RATE_WINDOW_S / 10
        follower._measure_rate(1)
    assert not follower.busy
    assert follower._consumer._fetcher._fetch_max_wait_ms == IDLE_FETCH_WAIT_MS


def test_a_slow_log_never_batches(monkeypatch):
    clock = [5.0]
    monkeypatch.setattr(eventlog.time, "monotonic", lambda: clock[0])
    follower = _follower(clock)
    for _ in range(100):
        clock[0] += 0.01
        follower._measure_rate(int(BUSY_RECORDS_PER_S * 0.01 / 2))
    assert not follower.busy
    assert follower._consumer._fetcher._fetch_min_bytes == 1
