"""The preemptor drops what it kept for a partition its consumer group takes away (its
index of candidate victims and the placer's views beside it): the revoke hook
``gpusched-preemptor`` hands its follower (``gpusched_preemptor.main.revoked``), driven by
a real rebalance on the broker."""
from __future__ import annotations

import asyncio

from gpusched.adapters.log.follower import FollowerOptions, LogFollower
from gpusched.adapters.log.proposer import PartitionProposer
from gpusched.adapters.log.publisher import DeadLetters, EventPublisher
from gpusched.policies.preemption.victim_rules import PreemptionConfig
from gpusched.policies.supervision import SupervisionConfig
from gpusched_preemptor.decide import PreemptorDecider
from gpusched_preemptor.main import revoked


async def test_a_partition_the_group_takes_away_loses_its_kept_indexes(kafka_bootstrap, topics):
    publisher = EventPublisher(kafka_bootstrap, topics, 4)
    await publisher.start()
    group = f"{topics.prefix}preemptor"
    decider = PreemptorDecider("a", PreemptionConfig(), SupervisionConfig(), lambda now: ({}, 0.0, False))
    holder: dict = {}
    a_owns, b_owns = asyncio.Event(), asyncio.Event()

    def on_revoked(parts: set[int]) -> None:   # as the service wires it
        revoked(decider, holder["loop"], parts)

    a = LogFollower(kafka_bootstrap, topics, "preemptor-a", DeadLetters(publisher, "preemptor-a"),
                    FollowerOptions(group_id=group), on_assigned=lambda parts: a_owns.set(), on_revoked=on_revoked)
    b = LogFollower(kafka_bootstrap, topics, "preemptor-b", DeadLetters(publisher, "preemptor-b"),
                    FollowerOptions(group_id=group), on_assigned=lambda parts: b_owns.set())
    holder["loop"] = PartitionProposer(a, publisher, decider, "preemptor-a")
    await a.start()
    try:
        await asyncio.wait_for(a_owns.wait(), 60)
        await a.caught_up()
        owned = set(a.states)
        assert owned == {0, 1, 2, 3}
        for partition, state in a.states.items():    # a round on each: an index kept for each
            decider(partition, state, 1000.0)
        assert set(decider.memory) == owned
        await b.start()                               # the group rebalances: a gives some up
        await asyncio.wait_for(b_owns.wait(), 60)
        gone = set(b.states)
        assert gone and not gone & set(decider.memory)   # b's: a keeps nothing of them
        assert set(decider.memory) <= set(a.states)
    finally:
        await asyncio.gather(a.stop(), b.stop())
        await publisher.stop()
