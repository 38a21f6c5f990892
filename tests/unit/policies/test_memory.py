"""What a cycle keeps for the next (``policies.memory.CycleMemory``): kept while the cycles
read one state, dropped whole when they read another; and one per partition in the
placer, dropped with it."""
from __future__ import annotations

from gpusched.policies.memory import CycleMemory
from gpusched.policies.scheduler import Scheduler
from gpusched_placer.loop import PlacementDecider
from tests.unit.core.builders import Log, make_node, make_spec


def busy_pool() -> Log:
    log = Log(make_node("n0", gpus=2), make_node("n1", gpus=2, pool="other"))
    for i in range(3):
        assert log.submit(f"j{i}", make_spec(gpus=2)).accepted
    return log


def structures(memory: CycleMemory) -> list[object]:
    return [memory.parked, memory.keys, memory.indexes, memory.hosts, memory.victims, *memory.ends.values(),
            *memory.movable.values()]


def test_the_cycles_on_one_state_keep_every_structure():
    log, memory = busy_pool(), CycleMemory()
    Scheduler().schedule(log.state, log.now, memory)
    kept = structures(memory)
    assert memory.state is log.state and memory.indexes.indexes and memory.ends
    assert memory.ends_of("default") is memory.ends["default"]
    Scheduler().schedule(log.state, log.now + 1, memory)
    assert all(a is b for a, b in zip(structures(memory), kept))


def test_another_state_drops_every_structure_at_the_refresh():
    log, other, memory = busy_pool(), busy_pool(), CycleMemory()
    Scheduler().schedule(log.state, log.now, memory)
    kept = structures(memory)
    memory.refresh(other.state)
    assert memory.state is other.state and memory.ends == {} and memory.movable == {}
    assert not any(a is b for a, b in zip(structures(memory), kept))
    assert not memory.indexes.indexes and memory.parked.jobs == set()


def test_the_placer_keeps_one_memory_per_partition_and_drops_it_with_the_partition():
    log = busy_pool()
    decider = PlacementDecider(Scheduler(), "placer-test")
    decider(0, log.state, log.now)
    decider(1, log.state, log.now)
    zero = decider.memory(0).policies
    assert zero is not decider.memory(1).policies and zero.state is log.state
    decider.forget({0})
    assert decider.memory(0).policies is not zero
