"""The statement: the one way policies change a ``ClusterState`` tentatively.

A scheduling cycle places many jobs, and each must see the ones placed before it; a
preemption search releases victims to see what fits; a reservation keeps capacity out of
reach; a nomination keeps nodes for a preemption's beneficiary. Rather than copying a
cluster of thousands of nodes, all of them write into the live state — but only through
a ``Statement``, which records every change as an operation with an exact inverse. A
``checkpoint`` is a position in that record; ``rollback`` undoes the operations after
it, last first, and leaves the state bit for bit as it was there (the digest agrees).
The statement is always rolled back to its start before the state is used again for
the log (``tentative``): only the reducer changes the state for good. This is
KAI-Scheduler's ``Statement`` and Kubernetes' assume/forget, bounded by one call.

The operations:

* ``book`` / ``release``: a job's workers, with the reducer's own ``commit``/``release``
  (node counters, node job sets, team usage), so the counters add up and undo exactly;
* ``take`` / ``give``: one worker's resources on a node's counters only — what counting
  how many workers fit reads, cheaper than a booking;
* ``hold`` / ``lift``: a reservation's hold, a set of counter increments (``used_cpu``,
  ``used_milli``, ...) and MIG slice bits that make free capacity look taken;
* ``nominate`` / ``unnominate``: nodes made unschedulable (cordoned) for everyone but a
  preemption's beneficiary.

Every operation, and every undo, tells the *views* (``views``: free-capacity indexes,
numpy mirrors that placement policies build once per cycle) which nodes changed, so
they stay true without being rebuilt; nothing else writes the nodes behind their back.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator, Protocol

from gpusched.core.capacity import book_resources, commit, release
from gpusched.core.model import GpuSlot, NodeStatus, WorkerAssignment, WorkerResources
from gpusched.core.state import ClusterState, JobState, NodeState

# A counter change: (object, attribute, delta). ``mig_mask`` deltas are bits toggled
# (xor): a hold sets bits that were clear, its lift clears them, and either undoes itself.
Change = tuple[object, str, int]

_BOOK, _RELEASE, _TAKE, _GIVE, _ADJUST, _STATUS = range(6)


class NodeView(Protocol):
    def touch(self, names: Iterable[str]) -> None:
        """These nodes' allocations or status changed: refresh what is derived from them."""


class Statement:
    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self._ops: list[tuple] = []
        self.views: dict[object, NodeView] = {}

    # --- jobs ------------------------------------------------------------------------------
    def book(self, job: JobState, workers: tuple[WorkerAssignment, ...]) -> None:
        """Book ``workers`` of ``job`` as the reducer would on ``JobPlaced``."""
        state = self.state
        nodes, job_id = state.nodes, job.job_id
        # What undoing it must leave as it was: the team's usage entry, and the nodes
        # that list the job already (another worker of it booked there).
        if len(workers) == 1:   # most jobs: one node, no generator or comprehension to run
            name = workers[0].node
            names: tuple[str, ...] = (name,)
            listed = [name] if job_id in nodes[name].jobs else []
        else:
            names = tuple(w.node for w in workers)
            listed = [name for name in names if job_id in nodes[name].jobs]
        before = (job.spec.team not in state.usage, listed)
        commit(state, job, workers)
        self._ops.append((_BOOK, job, workers, before))
        if self.views:
            self._notify(names)

    def release(self, job: JobState, workers: tuple[WorkerAssignment, ...] | None = None) -> None:
        """Release ``workers`` of ``job`` (all it holds by default) as the reducer would."""
        workers = job.workers if workers is None else workers
        release(self.state, job, workers)
        self._ops.append((_RELEASE, job, workers, False))
        self._notify_workers(workers)

    # --- one worker's resources, for counting what fits -------------------------------------
    def take(self, node: NodeState, res: WorkerResources, slots: tuple[GpuSlot, ...]) -> None:
        book_resources(node, res, slots, +1)
        self._ops.append((_TAKE, node, res, slots))
        self._notify((node.name,))

    def give(self, node: NodeState, res: WorkerResources, slots: tuple[GpuSlot, ...]) -> None:
        book_resources(node, res, slots, -1)
        self._ops.append((_GIVE, node, res, slots))
        self._notify((node.name,))

    # --- reservation holds ------------------------------------------------------------------
    def hold(self, changes: tuple[Change, ...], nodes: tuple[str, ...]) -> None:
        """Apply counter ``changes`` (on ``nodes``): capacity kept for a reservation."""
        _adjust(changes, +1)
        self._ops.append((_ADJUST, changes, nodes, +1))
        self._notify(nodes)

    def lift(self, changes: tuple[Change, ...], nodes: tuple[str, ...]) -> None:
        """Take back a ``hold`` of ``changes``, whatever was booked since: the counters
        add up, and the slice bits it set stayed out of every booking's reach."""
        _adjust(changes, -1)
        self._ops.append((_ADJUST, changes, nodes, -1))
        self._notify(nodes)

    # --- nominations ------------------------------------------------------------------------
    def nominate(self, names: Iterable[str]) -> tuple[NodeState, ...]:
        """Cordon the ready nodes among ``names`` (in name order); the ones cordoned."""
        nodes = self.state.nodes
        held = tuple(nodes[n] for n in sorted(names) if n in nodes and nodes[n].status is NodeStatus.READY)
        self._set_status(held, NodeStatus.CORDONED)
        return held

    def unnominate(self, held: tuple[NodeState, ...]) -> None:
        """Make ``held`` (what ``nominate`` returned) ready again."""
        self._set_status(held, NodeStatus.READY)

    def _set_status(self, held: tuple[NodeState, ...], status: NodeStatus) -> None:
        if not held:
            return
        before = tuple(node.status for node in held)
        for node in held:
            node.status = status
        self._ops.append((_STATUS, held, before, status))
        self._notify(tuple(node.name for node in held))

    # --- checkpoints --------------------------------------------------------------------------
    def checkpoint(self) -> int:
        return len(self._ops)

    def rollback(self, mark: int = 0) -> None:
        """Undo every operation after ``mark``, last first."""
        ops = self._ops
        state = self.state
        while len(ops) > mark:
            kind, a, b, c = ops.pop()
            if kind == _BOOK:
                release(state, a, b)
                new_team, listed = c
                for name in listed:
                    state.nodes[name].jobs.add(a.job_id)
                if new_team:
                    usage = state.usage.get(a.spec.team)
                    if usage is not None and not (usage.gpu_milli or usage.cpu_milli
                                                  or usage.memory_mib or usage.jobs):
                        del state.usage[a.spec.team]
                self._notify_workers(b)
            elif kind == _RELEASE:
                commit(state, a, b)
                self._notify_workers(b)
            elif kind == _TAKE:
                book_resources(a, b, c, -1)
                self._notify((a.name,))
            elif kind == _GIVE:
                book_resources(a, b, c, +1)
                self._notify((a.name,))
            elif kind == _ADJUST:
                _adjust(a, -c)
                self._notify(b)
            else:
                for node, status in zip(a, b):
                    node.status = status
                self._notify(tuple(node.name for node in a))

    def close(self) -> None:
        """The end of the call: nothing will read the views again; undo everything."""
        self.views.clear()
        self.rollback(0)

    def _notify_workers(self, workers: tuple[WorkerAssignment, ...]) -> None:
        if self.views:
            self._notify(tuple(w.node for w in workers))

    def _notify(self, names: tuple[str, ...]) -> None:
        for view in self.views.values():
            view.touch(names)


def _adjust(changes: tuple[Change, ...], sign: int) -> None:
    for target, attr, delta in changes:
        if attr == "mig_mask":
            target.mig_mask ^= delta   # type: ignore[attr-defined]
        else:
            setattr(target, attr, getattr(target, attr) + sign * delta)


@contextmanager
def tentative(state: ClusterState) -> Iterator[Statement]:
    """A statement on ``state``, rolled back to its start when the block ends."""
    statement = Statement(state)
    try:
        yield statement
    finally:
        statement.close()


LENT = "lent-state"   # a statement's view key of the state lent to it (``LentState``)


class LentState:
    """The log state lent to a statement whose own state holds the nodes only (the
    preemptor's placer questions run on such a copy): a policy reads the jobs and the
    pending queue here (``lent_state``), as the placer's cycle reads them from its state.
    ``memo``: what a policy counted of them once for the statement, while the state was
    the log's (FGD's pool mixes). A statement view: nothing a statement changes on the
    shared nodes changes the log's jobs, so ``touch`` does nothing."""

    __slots__ = ("state", "memo")

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.memo: dict[object, object] = {}

    def touch(self, names: Iterable[str]) -> None:
        """Bookings, releases and holds change no job of the log's state."""


def lend(statement: Statement, state: ClusterState, policy: object = None) -> LentState:
    """Lend ``statement`` the jobs of ``state``; call while ``state`` is the log's. The
    placement ``policy``'s optional ``lend(lent, statement)`` then counts what it must
    count of the log's state before anything changes it."""
    lent = LentState(state)
    statement.views[LENT] = lent
    hook = getattr(policy, "lend", None)
    if hook is not None:
        hook(lent, statement)
    return lent


def lent_state(statement: Statement) -> ClusterState | None:
    """The state lent to ``statement`` (``lend``), None where its own has the jobs."""
    lent = statement.views.get(LENT)
    return None if lent is None else lent.state   # type: ignore[attr-defined]
