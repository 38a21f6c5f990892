"""EventPublisher after the broker refused a record (gpusched/adapters/log/publisher.py): the
idempotent producer's sequence then has a gap and the broker refuses every later record
of the partition as out of order; the first such refusal from the current producer puts
a new producer in its place, once. With a real broker: tests/integration/test_report_order.py."""
from __future__ import annotations

import asyncio

import pytest
from aiokafka.errors import OutOfOrderSequenceNumber, TopicAuthorizationFailedError

from gpusched.adapters.broker.kafka_admin import TopicNames
from gpusched.adapters.log.publisher import EventPublisher
from gpusched.core import events as ev


class Producer:
    """Stands in for aiokafka's: each record's acknowledgement is the test's to give."""

    def __init__(self) -> None:
        self.acks: list[asyncio.Future] = []
        self._message_accumulator = None   # the linger tuner's, untouched at this rate
        self.started = self.stopped = False

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    async def send(self, topic, value, **kwargs) -> asyncio.Future:
        self.acks.append(asyncio.get_running_loop().create_future())
        return self.acks[-1]


def _report(i: int) -> ev.NodeCordoned:
    return ev.NodeCordoned(event_id=f"e{i}", time=1.0, producer="agent", node="n", reason="test")


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


# Every way a record goes out: a report to a node's topic, an event on the pool log (the
# relay's and every service's), a raw record (heartbeats, work views).
SENDS = {"report": lambda p, i: p.send_event_to("t.reports.n", _report(i), "default"),
         "pool log": lambda p, i: p.send(_report(i), "default"),
         "raw": lambda p, i: p.send_raw_later("t.beats.n", b"beat", key=b"n")}


@pytest.mark.parametrize("send", SENDS.values(), ids=SENDS.keys())
async def test_records_refused_out_of_order_go_through_a_new_producer_made_once(monkeypatch, send):
    publisher = EventPublisher("127.0.0.1:1", TopicNames("t."), 4)
    made: list[Producer] = []

    def new_producer() -> Producer:
        made.append(Producer())
        return made[-1]
    monkeypatch.setattr(publisher, "_new_producer", new_producer)
    publisher._producer = new_producer()
    old = made[0]
    acks = [await send(publisher, i) for i in range(4)]
    acks[0].set_exception(TopicAuthorizationFailedError("t.reports.n"))   # refused: the gap
    await _settle()
    assert len(made) == 1                       # a refusal alone leaves the producer as it is
    acks[1].set_exception(OutOfOrderSequenceNumber())
    acks[2].set_exception(OutOfOrderSequenceNumber())
    await asyncio.sleep(0)                                    # their callbacks run
    await send(publisher, 4)                                  # waits for the new producer
    assert len(made) == 2 and made[1].started and len(made[1].acks) == 1 and len(old.acks) == 4
    await _settle()
    assert old.stopped
    acks[3].set_exception(OutOfOrderSequenceNumber())   # the old one's last refusal: no third
    made[1].acks[0].set_result(None)
    await _settle()
    assert len(made) == 2
    await publisher.stop()
    assert made[1].stopped
