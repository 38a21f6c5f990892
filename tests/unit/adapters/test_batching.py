"""Batching by rate: the follower's fetch mode, the publisher's linger, and the aiokafka
internals they rely on (pinned version; this fails loudly if they change)."""
from __future__ import annotations

import asyncio
import inspect

from aiokafka.consumer.fetcher import Fetcher

import pytest

from gpusched.adapters.log import batching
from gpusched.adapters.log.batching import (
    FETCH_MODES, IDLE_FETCH_WAIT_MS, RATE_WINDOW_S, FetchMode, FetchTuner, fetch_mode_for, linger_for,
    next_fetch_mode, set_fetch_mode,
)
from gpusched.adapters.broker.kafka_admin import TopicNames
from gpusched.adapters.log import codec
from gpusched.adapters.log.publisher import EventPublisher, event_headers
from gpusched.core import events as ev
from tests.unit.core.builders import make_spec

LONG_POLL, BUSY, BURST = FETCH_MODES


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


def test_modes_hold_fetches_longer_as_the_rate_grows():
    assert LONG_POLL == FetchMode(0, 1, IDLE_FETCH_WAIT_MS)   # returns on the first record
    thresholds = [m.from_records_per_s for m in FETCH_MODES]
    waits = [m.max_wait_ms for m in FETCH_MODES[1:]]
    assert thresholds == sorted(thresholds) and waits == sorted(waits)
    assert all(m.min_bytes > 1 for m in FETCH_MODES[1:])


@pytest.mark.parametrize("rate, expected", [
    (0, LONG_POLL),
    (BUSY.from_records_per_s - 1, LONG_POLL),
    (BUSY.from_records_per_s, BUSY),
    (900, BUSY),                                  # ~200 jobs/s on one pool
    (BURST.from_records_per_s - 1, BUSY),
    (BURST.from_records_per_s, BURST),
    (50_000, BURST),
])
def test_fetch_mode_for_rate(rate, expected):
    assert fetch_mode_for(rate) == expected


@pytest.mark.parametrize("current, rate, streak, expected", [
    # quieter: at once, streak cleared
    (BURST, 10, 0, (LONG_POLL, 0)),
    (BURST, 900, 2, (BUSY, 0)),
    (BUSY, 10, 1, (LONG_POLL, 0)),
    (BUSY, 900, 0, (BUSY, 0)),
    # busier, one window is enough for BUSY
    (LONG_POLL, 900, 0, (BUSY, 0)),
    # a burst-rate window: BUSY first, BURST only after BURST.sustained_windows in a row
    (LONG_POLL, 5_000, 0, (BUSY, 1)),
    (BUSY, 5_000, 1, (BUSY, 2)),
    (BUSY, 5_000, 2, (BURST, 0)),
    (BURST, 5_000, 0, (BURST, 0)),
])
def test_next_fetch_mode(current, rate, streak, expected):
    assert BURST.sustained_windows == 3
    assert next_fetch_mode(current, rate, streak) == expected


def test_one_backlog_window_does_not_reach_the_burst_mode(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(batching.time, "monotonic", lambda: clock[0])
    follower = _Follower(clock)
    for rate in (900, 900, 6_000, 900, 900, 6_000, 900):   # a stall's backlog now and then
        _run_window(follower, clock, rate)
        assert follower.fetch_mode == BUSY, rate


def test_set_fetch_mode_sets_both_attributes():
    consumer = _Consumer()
    for mode in (BURST, LONG_POLL, BUSY):
        set_fetch_mode(consumer, mode)
        assert (consumer._fetcher._fetch_min_bytes, consumer._fetcher._fetch_max_wait_ms) == \
            (mode.min_bytes, mode.max_wait_ms)


class _Follower:
    """A consumer and its tuner, as the follower holds them."""

    def __init__(self, clock: list[float]) -> None:
        self.consumer = _Consumer()
        self.tuner = FetchTuner()
        self.tuner.start_window(clock[0])

    @property
    def fetch_mode(self) -> FetchMode:
        return self.tuner.mode


def _run_window(follower: _Follower, clock: list[float], records_per_s: float) -> None:
    """A window and a bit of fetches at this rate, in ten small batches."""
    per_batch = int(records_per_s * RATE_WINDOW_S / 10)
    for _ in range(11):
        clock[0] += RATE_WINDOW_S / 10
        follower.tuner.count(follower.consumer, per_batch)


def test_the_mode_follows_the_rate_up_and_back_down(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(batching.time, "monotonic", lambda: clock[0])
    follower = _Follower(clock)
    burst = [(2 * BURST.from_records_per_s, BUSY)] * (BURST.sustained_windows - 1) + \
        [(2 * BURST.from_records_per_s, BURST)]
    for rate, expected in [(2 * BUSY.from_records_per_s, BUSY), *burst,
                           (2 * BUSY.from_records_per_s, BUSY), (10, LONG_POLL)]:
        _run_window(follower, clock, rate)
        assert follower.fetch_mode == expected, rate
        assert follower.consumer._fetcher._fetch_max_wait_ms == expected.max_wait_ms
        assert follower.consumer._fetcher._fetch_min_bytes == expected.min_bytes


def test_a_slow_log_never_batches(monkeypatch):
    clock = [5.0]
    monkeypatch.setattr(batching.time, "monotonic", lambda: clock[0])
    follower = _Follower(clock)
    for _ in range(100):
        clock[0] += 0.01
        follower.tuner.count(follower.consumer, int(BUSY.from_records_per_s * 0.01 / 2))
    assert follower.fetch_mode == LONG_POLL
    assert follower.consumer._fetcher._fetch_min_bytes == 1


# --- the producer's linger --------------------------------------------------------
def test_aiokafka_gives_new_batches_the_accumulators_linger():
    from aiokafka.producer.message_accumulator import MessageAccumulator
    from aiokafka.producer.producer import AIOKafkaProducer
    assert "self._linger_time = linger_ms / 1000" in inspect.getsource(MessageAccumulator.__init__)
    assert "MessageBatch(tp, builder, self._batch_ttl, self._linger_time)" in inspect.getsource(MessageAccumulator)
    assert "self._message_accumulator = MessageAccumulator(" in inspect.getsource(AIOKafkaProducer.__init__)


@pytest.mark.parametrize("rate, linger", [
    (0, 1), (200, 1), (599, 1),     # a quiet producer, and any service at 200 jobs/s
    (600, 5), (5_000, 5),           # a burst
])
def test_linger_for_rate(rate, linger):
    assert linger_for(rate) == linger


async def test_the_linger_follows_the_send_rate_up_and_back_down(monkeypatch):   # a producer needs a loop
    clock = [100.0]
    monkeypatch.setattr(batching.time, "monotonic", lambda: clock[0])
    publisher = EventPublisher("127.0.0.1:1", TopicNames("t."), 4)
    assert publisher.linger_ms == 1 and publisher._producer._message_accumulator._linger_time == 0.001

    def window(events_per_s: float) -> None:
        for _ in range(int(events_per_s * RATE_WINDOW_S)):
            clock[0] += 1 / events_per_s
            publisher._linger.count(publisher._producer)

    for rate, expected in [(2_000, 5), (2_000, 5), (100, 1), (1_000, 5)]:
        window(rate)
        window(rate)   # the second window's first send closes the first
        assert publisher.linger_ms == expected, rate
        assert publisher._producer._message_accumulator._linger_time == expected / 1000
    clock[0] += 30       # a quiet spell: the next send already goes with the quiet linger
    publisher._linger.count(publisher._producer)
    assert publisher.linger_ms == 1


async def test_reports_and_raw_records_count_toward_the_linger_too(monkeypatch):
    """A node host's burst of reports (``send_event_to``) and the work views' records
    (``send_raw_later``) are batched as the pool log's events are."""
    clock = [100.0]
    monkeypatch.setattr(batching.time, "monotonic", lambda: clock[0])
    publisher = EventPublisher("127.0.0.1:1", TopicNames("t."), 4)

    async def queued(*args, **kwargs):   # the producer's queue, without a broker behind it
        return asyncio.get_running_loop().create_future()
    monkeypatch.setattr(publisher._producer, "send", queued)
    for i in range(int(2 * 2_000 * RATE_WINDOW_S) + 1):   # two windows and a send at 2,000/s
        clock[0] += 1 / 2_000
        if i % 2:
            await publisher.send_event_to("t.hostreports.h", ev.NodeLost(event_id=f"e{i}", node="h-1"), "default")
        else:
            await publisher.send_raw_later("t.work.h-1", b"{}", key=b"node")
    assert publisher.linger_ms == 5


async def test_a_submit_batch_of_500_jobs_fits_one_produce_batch():   # a producer needs a loop
    """aiokafka holds every send while a partition's batch is full: a SubmitJobs batch (500
    jobs, one pool) must fit one, not wait out a dozen round trips."""
    publisher = EventPublisher("127.0.0.1:1", TopicNames("t."), 4)
    builder = publisher._producer._message_accumulator.create_builder()
    for i in range(500):
        event = ev.JobSubmitted(event_id=f"{i:032x}", time=1.0, producer="admission-0123abcd", job_id=f"job-{i:08d}",
                                spec=make_spec(name=f"openb-{i}", gpus=1, cpu=8000, mem=32768),
                                principal="team-a-submitter")
        carrier = {"traceparent": f"00-{i:032x}-{i:016x}-01"}
        appended = builder.append(key=b"default", value=codec.encode(event, "default", carrier), timestamp=None,
                                  headers=event_headers(event, carrier))
        assert appended is not None, f"the batch was full after {i} jobs"
