"""``TopicReader``: the consumer it builds from a connection, where an assignment starts,
the fetch loop and what a failed fetch does, a clean stop. A fake consumer stands in for
aiokafka's (the readers on a real broker are the integration tests of their users)."""
from __future__ import annotations

import asyncio

import pytest
from aiokafka import TopicPartition

from gpusched.adapters.broker import topic_reader
from gpusched.adapters.broker.kafka_security import KafkaConnection
from gpusched.adapters.broker.topic_reader import TopicReader

TP0, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)


class FakeConsumer:
    made: list["FakeConsumer"] = []

    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs
        self.calls: list[tuple] = []
        self.fetches: list = []     # what each getmany returns, or raises
        self.started = self.stopped = False
        FakeConsumer.made.append(self)

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    def assign(self, tps) -> None:
        self.calls.append(("assign", list(tps)))

    async def seek_to_beginning(self, *tps) -> None:
        self.calls.append(("beginning", tps))

    async def seek_to_end(self, *tps) -> None:
        self.calls.append(("end", tps))

    def seek(self, tp, offset) -> None:
        self.calls.append(("seek", tp, offset))

    async def getmany(self, *tps, timeout_ms=0, max_records=None):
        self.calls.append(("getmany", tps, timeout_ms, max_records))
        if not self.fetches:
            await asyncio.sleep(3600)
        out = self.fetches.pop(0)
        if isinstance(out, Exception):
            raise out
        return out


@pytest.fixture(autouse=True)
def fake(monkeypatch):
    FakeConsumer.made = []
    monkeypatch.setattr(topic_reader, "AIOKafkaConsumer", FakeConsumer)


async def test_the_consumer_is_built_at_start_from_the_connection_with_the_settings_given():
    reader = TopicReader(KafkaConnection("b:9092"), group_id="p.relay", client_id="r", fetch_max_wait_ms=20)
    assert not reader.started and not FakeConsumer.made
    await reader.start()
    [consumer] = FakeConsumer.made
    assert consumer.started
    assert consumer.kwargs == {"bootstrap_servers": "b:9092", "group_id": "p.relay", "enable_auto_commit": False,
                               "client_id": "r", "fetch_max_wait_ms": 20}
    await reader.start()   # again: the same consumer
    assert FakeConsumer.made == [consumer]
    await reader.stop()
    await reader.stop()
    assert consumer.stopped and not reader.started


def test_a_reader_never_commits_on_its_own():
    with pytest.raises(TypeError):
        TopicReader("b:9092", enable_auto_commit=True)


async def test_an_assignment_starts_where_asked():
    async with TopicReader("b:9092") as reader:
        consumer = FakeConsumer.made[0]
        assert await reader.assign([TP0, TP1], "beginning") == [TP0, TP1]
        await reader.assign([TP0], "end")
        await reader.assign([TP1], 42)
        await reader.assign([TP0])
    assert consumer.calls == [("assign", [TP0, TP1]), ("beginning", (TP0, TP1)), ("assign", [TP0]), ("end", (TP0,)),
                              ("assign", [TP1]), ("seek", TP1, 42), ("assign", [TP0])]
    assert consumer.stopped


async def test_a_reader_not_started_says_so():
    with pytest.raises(RuntimeError, match="not started"):
        await TopicReader("b:9092").fetch(TP0)


async def test_run_hands_each_batch_over_and_asks_what_to_do_with_a_failed_fetch():
    reader = await TopicReader("b:9092").start()
    consumer = FakeConsumer.made[0]
    failure = RuntimeError("broker away")
    consumer.fetches = [{TP0: ["a"]}, {}, failure, {TP1: ["b", "c"]}]
    handled, failed = [], []

    async def handle(batches):
        handled.append(batches)

    async def on_fetch_error(exc):
        failed.append(exc)

    task = asyncio.create_task(reader.run(handle, max_records=7, on_fetch_error=on_fetch_error))
    for _ in range(50):
        await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert handled == [{TP0: ["a"]}, {TP1: ["b", "c"]}]   # an empty fetch is not handed over
    assert failed == [failure]
    assert consumer.calls[0] == ("getmany", (), 200, 7)


async def test_run_stops_on_what_the_handler_or_the_error_hook_raises():
    reader = await TopicReader("b:9092").start()
    consumer = FakeConsumer.made[0]
    consumer.fetches = [ValueError("bad")]

    async def reraise(exc):
        raise exc

    async def handle(batches):
        raise AssertionError("no batch")

    with pytest.raises(ValueError):
        await reader.run(handle, on_fetch_error=reraise)
    consumer.fetches = [{TP0: ["a"]}]
    with pytest.raises(AssertionError):
        await reader.run(handle)
