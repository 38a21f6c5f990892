"""How many records a Kafka request carries, chosen from the rate: the follower's fetch
mode and the publisher's linger.

Every Kafka request costs a fixed amount of CPU in aiokafka, the kernel's loopback path
and the broker whatever it carries, so at a thousand jobs a second requests of one or two
records would cost more than everything else the services do. So a busy log is read and
written in batches, and a quiet one record by record, for latency. The modes and their
thresholds were chosen with ``bench/submit_bench.py`` (docs/design/benchmarks.md, "The job API through
the log").

aiokafka (0.14, pinned) offers no setter for the fetch wait or the linger of a running
client; ``set_fetch_mode`` and ``set_linger`` write the attributes it reads, and
tests/unit/adapters/test_batching.py checks that it still reads them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

RATE_WINDOW_S = 0.1   # the rate that picks a mode is measured over windows this long


@dataclass(frozen=True, slots=True)
class FetchMode:
    """A quiet log gets a plain long poll that returns on the first new record; a busier
    one asks the broker to hold each fetch for up to ``max_wait_ms`` (or until
    ``min_bytes`` arrived), so one fetch carries many records, at the price of at most
    that wait per hop."""

    from_records_per_s: float
    min_bytes: int
    max_wait_ms: int
    # windows in a row the rate must call for this mode (or busier) before it is taken:
    # a stalled follower fetches its backlog in one go, which reads as a burst, and the
    # longer wait would then feed the stall that caused it
    sustained_windows: int = 1


FETCH_MODES = (
    FetchMode(0, 1, 200),              # long poll
    FetchMode(400, 1 << 20, 5),        # ~200 jobs/s on a pool: latency still matters
    FetchMode(3_000, 1 << 20, 20, sustained_windows=3),   # a burst: throughput matters more
)
IDLE_FETCH_WAIT_MS = FETCH_MODES[0].max_wait_ms

# A producer's linger by its own send rate (events/s), the same idea for writes: a quiet
# producer's records go at once; in a burst a longer linger batches more records a request.
LINGER_MODES = ((0, 1), (600, 5))   # (from events/s, linger ms)
LINGER_MS = LINGER_MODES[0][1]
# The most bytes one produce batch (of one partition) carries. aiokafka fills one batch per
# partition at a time and, once it is full, holds every further send until it is sent:
# with its 16 KiB default a SubmitJobs of 500 jobs went out as a dozen batches one round
# trip after another, and a node host's burst of reports waited batch by batch. Under the
# broker's default record-batch limit (1 MiB, ``max.message.bytes``).
MAX_BATCH_BYTES = 512 * 1024


def linger_for(events_per_s: float) -> int:
    """The linger (ms) of the busiest mode whose threshold the rate reaches."""
    return max((ms for rate, ms in LINGER_MODES if events_per_s >= rate), default=LINGER_MS)


def set_linger(producer: AIOKafkaProducer, linger_ms: int) -> None:
    """aiokafka gives each new batch the accumulator's ``_linger_time``."""
    producer._message_accumulator._linger_time = linger_ms / 1000


def fetch_mode_for(records_per_s: float, streak: float = float("inf")) -> FetchMode:
    """The busiest mode whose threshold the rate reaches, among those a streak of that
    many busy windows has earned (by default: all)."""
    mode = FETCH_MODES[0]
    for candidate in FETCH_MODES[1:]:
        if records_per_s >= candidate.from_records_per_s and candidate.sustained_windows <= streak:
            mode = candidate
    return mode


def next_fetch_mode(current: FetchMode, records_per_s: float, streak: int) -> tuple[FetchMode, int]:
    """The mode after a window at this rate, and the new count of windows in a row that
    asked for a busier mode than the current one. Quieter: at once; busier: only as
    busy as the streak allows."""
    wanted = fetch_mode_for(records_per_s)
    if wanted.from_records_per_s <= current.from_records_per_s:
        return wanted, 0
    streak += 1
    mode = max(current, fetch_mode_for(records_per_s, streak), key=lambda m: m.from_records_per_s)
    return mode, (0 if mode == wanted else streak)


def set_fetch_mode(consumer: AIOKafkaConsumer, mode: FetchMode) -> None:
    """aiokafka builds every FetchRequest from these two fetcher attributes."""
    fetcher = consumer._fetcher
    fetcher._fetch_min_bytes = mode.min_bytes
    fetcher._fetch_max_wait_ms = mode.max_wait_ms


class FetchTuner:
    """Counts the records a consumer fetched per ``RATE_WINDOW_S``; at the end of each
    window, switches the consumer's fetch mode if the rate calls for another one."""

    def __init__(self) -> None:
        self.mode = FETCH_MODES[0]
        self._busier_streak = 0              # see next_fetch_mode
        self._window = (0.0, 0)              # (start, records since)

    def start_window(self, now: float) -> None:
        self._window = (now, 0)

    def count(self, consumer: AIOKafkaConsumer, records: int) -> None:
        now = time.monotonic()
        start, count = self._window
        count += records
        if now - start < RATE_WINDOW_S:
            self._window = (start, count)
            return
        mode, self._busier_streak = next_fetch_mode(self.mode, count / (now - start), self._busier_streak)
        self._window = (now, 0)
        if mode != self.mode:
            self.mode = mode
            set_fetch_mode(consumer, mode)


class LingerTuner:
    """Counts a producer's sends per ``RATE_WINDOW_S``; once a window is over (checked
    before this send, so the first send after a quiet spell already goes with the quiet
    linger), takes the linger its rate calls for."""

    def __init__(self) -> None:
        self.linger_ms = LINGER_MS
        self._window = (time.monotonic(), 0)   # (start, events sent since)

    def count(self, producer: AIOKafkaProducer) -> None:
        now = time.monotonic()
        start, count = self._window
        if now - start < RATE_WINDOW_S:
            self._window = (start, count + 1)
            return
        self._window = (now, 1)
        linger = linger_for(count / (now - start))
        if linger != self.linger_ms:
            self.linger_ms = linger
            set_linger(producer, linger)
