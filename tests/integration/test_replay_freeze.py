"""``freeze_state``: a follower that moves what each replay batch built out of the cyclic
GC's reach rebuilds exactly the state a plain follower does, and really does freeze it."""
from __future__ import annotations

import gc
import uuid

from gpusched.adapters.log.follower import FollowerOptions, LogFollower
from gpusched.adapters.log.gc_pacing import GC_PAUSE_MIN
from gpusched.adapters.log.publisher import DeadLetters, EventPublisher
from gpusched.core import events as ev
from gpusched.core.digest import digest
from tests.unit.core.builders import make_node, make_spec

EVENTS = 3 * GC_PAUSE_MIN   # replay batches big enough to count as replaying


async def _replay(bootstrap, topics, publisher, freeze: bool):
    follower = LogFollower(bootstrap, topics, f"freeze-{uuid.uuid4().hex[:6]}", DeadLetters(publisher, "t"),
                           FollowerOptions(freeze_state=freeze))
    before = gc.get_freeze_count()
    await follower.start()
    try:
        await follower.caught_up()
        return {p: digest(s) for p, s in follower.states.items() if s.applied}, gc.get_freeze_count() - before
    finally:
        await follower.stop()


async def test_a_freezing_follower_rebuilds_the_same_state(kafka_bootstrap, topics):
    publisher = EventPublisher(kafka_bootstrap, topics, 4)
    await publisher.start()
    try:
        items = [(ev.NodeRegistered(event_id="n0", time=0.0, producer="t", node=make_node("n0", gpus=8)), "default")]
        items += [(ev.JobSubmitted(event_id=f"e{i}", time=float(i), producer="t", job_id=f"j{i}",
                                   spec=make_spec(name=f"j{i}", gpus=1 + i % 4)), "default") for i in range(EVENTS)]
        await publisher.publish_all(items)
        try:
            frozen, frozen_count = await _replay(kafka_bootstrap, topics, publisher, freeze=True)
            plain, plain_count = await _replay(kafka_bootstrap, topics, publisher, freeze=False)
        finally:
            gc.unfreeze()   # give this test process its objects back
        assert frozen == plain and len(plain) == 1
        assert frozen_count > EVENTS    # every job state built by the replay, at least
        assert plain_count <= 0          # freezes nothing (frozen objects may die meanwhile)
    finally:
        await publisher.stop()
