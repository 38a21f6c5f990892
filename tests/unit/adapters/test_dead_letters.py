"""Warnings about skipped records: one line each, at most so many a window, then one line
saying how many were held back."""
from __future__ import annotations

import asyncio
import logging

from gpusched.adapters.log.dead_letters import WarningLimit, letter_key
from gpusched.adapters.log.publisher import DeadLetters, DeadRecord


def test_a_flood_is_limited_per_window_and_the_rest_counted(caplog):
    now = [0.0]
    limit = WarningLimit(logging.getLogger("t"), "placer: records skipped", per_window=10, window_s=60.0,
                         clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, "t"):
        for i in range(25):
            limit.warn("skipped offset %d", i)
        assert [r.getMessage() for r in caplog.records] == [f"skipped offset {i}" for i in range(10)]
        now[0] = 61.0
        limit.warn("skipped offset %d", 99)
    assert [r.getMessage() for r in caplog.records[10:]] == [
        "placer: records skipped: 15 more not logged one by one in the last 61s (at most 10 lines a window)",
        "skipped offset 99"]


def test_a_read_only_consumer_logs_topic_partition_offset_and_reason(caplog):
    letters = DeadLetters(None, "billing-1")
    with caplog.at_level(logging.WARNING, "gpusched.adapters.log.publisher"):
        asyncio.run(letters.put(DeadRecord("p.cluster-events", 2, 17, b"k", b"junk"), "not an EventEnvelope"))
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == ("billing-1: skipped a record it cannot apply: topic p.cluster-events partition 2 offset 17: "
                    "not an EventEnvelope (read-only here: not dead-lettered)")
    assert list(letters.skipped) == [("p.cluster-events", 2, 17, "not an EventEnvelope")]


def test_a_letters_key_names_its_record_whoever_writes_it():
    assert letter_key("p.cluster-events", 2, 17) == b"p.cluster-events:2:17" != letter_key("p.usage", 2, 17)
