"""The ordered sender (gpusched.adapters.nodes.ordered_sender) over random failures: whatever
fails, and whether a failed record landed anyway (its acknowledgement lost) or not, and in
whatever order the acknowledgements come back, the last record that lands for each key is
the newest one given for it, every batch is reported acknowledged once, in order, and no
more than ``depth`` batches are ever in flight."""
from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.adapters.nodes.ordered_sender import OrderedSender

OK, LOST, LANDED_ACK_LOST = "ok", "lost", "landed-ack-lost"


class Broker:
    """Lands each record as it is sent (unless its outcome is ``lost``) and answers its
    acknowledgement after a drawn number of loop turns, failed per the drawn outcome;
    once the outcomes run out, every send succeeds."""

    def __init__(self, outcomes: list[str], delays: list[int]) -> None:
        self.outcomes, self.delays = list(outcomes), list(delays)
        self.landed: list[tuple[str, int]] = []

    async def send(self, record: tuple[str, int]) -> asyncio.Future:
        outcome = self.outcomes.pop(0) if self.outcomes else OK
        if outcome != LOST:
            self.landed.append(record)
        ack = asyncio.get_running_loop().create_future()
        turns = self.delays.pop(0) if self.delays else 0

        def answer(left: int) -> None:
            if left:
                asyncio.get_running_loop().call_soon(answer, left - 1)
            elif outcome == OK:
                ack.set_result(None)
            else:
                ack.set_exception(TimeoutError(f"{record} {outcome}"))
        answer(turns)
        return ack


batches_of = st.lists(st.lists(st.tuples(st.sampled_from("abcd"), st.just(0)), min_size=0, max_size=5),
                      min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(batches=batches_of, outcomes=st.lists(st.sampled_from([OK, OK, LOST, LANDED_ACK_LOST]), max_size=40),
       delays=st.lists(st.integers(0, 6), max_size=60), depth=st.integers(1, 4))
def test_the_newest_record_of_each_key_lands_last_whatever_fails(batches, outcomes, delays, depth):
    # number the records: (key, sequence), later given = newer
    seq = iter(range(10_000))
    batches = [[(key, next(seq)) for key, _ in batch] for batch in batches]
    broker = Broker(outcomes, delays)
    acked: list[int] = []

    async def scenario() -> OrderedSender:
        all_acked = asyncio.Event()

        def on_acked(batch: int) -> None:
            acked.append(batch)
            if len(acked) == len(batches):
                all_acked.set()
        sender = OrderedSender(broker.send, on_acked, "test", depth=depth, first_delay=0)
        acks = asyncio.create_task(sender.run())
        most = 0
        for i, batch in enumerate(batches):
            await sender.put(batch, i)
            most = max(most, len(sender._flights))
        await all_acked.wait()
        acks.cancel()
        assert most <= depth
        return sender

    sender = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert acked == list(range(len(batches)))
    newest = {key: n for batch in batches for key, n in batch}
    last_landed = {key: n for key, n in broker.landed}
    assert last_landed == newest
    assert sender.resends >= (1 if any(o != OK for o in outcomes[:sum(map(len, batches))]) else 0)

