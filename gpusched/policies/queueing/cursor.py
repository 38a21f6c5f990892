"""A cycle that stops on its budget of jobs tested (``max_job_test``) is continued by
the next one, as Slurm's backfill does with ``bf_continue``: the jobs past the budget are
tested in the following cycles instead of never, while the queue stays longer than it.

A *round* is the run of cycles from one that starts at the head of the queue to the first
that does not stop on the budget. Each cycle of a round takes, in queue order:

* the head: the first ``head`` jobs of the whole queue (nominees first, as always, and
  tested every cycle however many), whether or not the round tested them already: what
  is about to be placed is looked at every cycle;
* then only jobs the round has not tested yet, still in queue order (fair share charging
  only the jobs it hands out), plus the jobs that held a reservation in the last cycle:
  they are tested again in their place, so their reservations are made every cycle.

A cycle that stops on the budget adds the jobs it took to the round's tested set; any
other end of a cycle (the queue ran out, every shape left is bound to fail, or
``max_decisions``) ends the round, and the next cycle starts from the head with nothing
tested. So a job with ``ahead`` jobs before it in the queue that the round has not
tested is tested within the next ``ceil((ahead + 1) / (max_job_test - head))`` cycles
(arrivals ahead of it count; jobs placed or gone shorten it): a job at position ``p`` of a
queue that stays put, within ``1 + ceil((p - max_job_test) / (max_job_test - head))``
cycles. A cycle that never stops on the budget never continues: while none does, the
decisions are those of an unlimited budget.

A cycle stopped by the bound on its time (``max_cycle_s``, once it took ``min_job_test``
jobs) is continued alike, as one stopped on the budget: the bounds above hold with
``min_job_test`` in place of ``max_job_test`` (a cycle takes at least that many).

The cursor is kept with the pool state's ``QueueKeys``, in its ``CycleMemory`` (the placer:
one per owned partition); a replica that takes a partition over starts a round at the head, which is
where any round may start. A job id submitted again (retention frees ids) is a new job,
untested.
"""
from __future__ import annotations

from typing import AbstractSet, Iterable, Iterator

from gpusched.core.state import ClusterState, JobState


class JobTestCursor:
    """Where the round of cycles over one pool state's queue stands."""

    __slots__ = ("_state", "_watermark", "tested", "reserved", "_taken", "_lent", "round", "cycle", "done",
                 "skimming")

    def __init__(self) -> None:
        self._state: ClusterState | None = None
        self._watermark = 0                  # state.next_seq when the last cycle ended
        self.tested: set[str] = set()        # taken by an earlier cycle of this round
        self.reserved: frozenset[str] = frozenset()   # held a reservation in the last cycle
        self._taken: list[str] = []          # taken by this cycle
        self._lent: set[str] = set()         # tested, but tested again by this cycle (out of ``tested`` meanwhile)
        # For a lazy order (``TeamQueues``): the round (a count of resets) and the cycle,
        # and, once this cycle leaves them out (``skimming``), the jobs it leaves out.
        self.round = self.cycle = 0
        self.done: AbstractSet[str] = frozenset()
        self.skimming = False

    @property
    def continuing(self) -> bool:
        return bool(self.tested)

    def reset(self) -> None:
        self.round += 1
        self.tested = set()
        self.reserved = frozenset()
        self._lent = set()

    def order(self, state: ClusterState, order: Iterable[JobState], head: int,
              passed: set[str] | None = None, always: AbstractSet[str] = frozenset()) -> Iterator[JobState]:
        """``order`` as this cycle takes it: its first ``head`` jobs, then those the round
        has not tested (or that held a reservation, or are in ``always``: the nominees,
        first in any order). ``passed`` (given with a lazy order, ``TeamQueues.order``):
        the jobs it leaves out as it goes; the round's tested jobs are left out from when
        the head is taken (``skimming``: ``done``), so they are never produced (nor charged)."""
        self._taken = taken = []
        self.cycle += 1
        self.skimming = False
        done = self._untested_from(state, always)
        it = iter(order)
        if done and head > 0:
            for job in it:
                yield job
                taken.append(job.job_id)   # once asked for the next: the caller took it
                if len(taken) >= head:
                    break
        if done and passed is not None:
            self.done, self.skimming = done, True
        for job in it:
            if job.job_id in done:   # a lazy order's one job a team had drawn before ``skimming``
                continue
            yield job
            taken.append(job.job_id)

    def _untested_from(self, state: ClusterState, always: AbstractSet[str]) -> set[str]:
        """The jobs this cycle leaves out past the head: the round's tested jobs, less those
        that held a reservation and those in ``always`` (lent out of ``tested`` until the
        cycle ends: no copy of a set as long as the queue). Ids of jobs that left the queue
        are left in: they leave nothing out, and a round is bounded by the queue's length."""
        if state is not self._state or state.next_seq < self._watermark:
            self._state = state
            self.reset()
        tested = self.tested
        tested |= self._lent   # a cycle that did not end (``ended``) lent them
        if not tested:
            return tested
        jobs = state.jobs
        # Ids submitted since the last cycle are new jobs, even where a tested job had the id.
        for job_id in reversed(jobs):
            if jobs[job_id].seq < self._watermark:
                break
            tested.discard(job_id)
        self._lent = {j for j in (*self.reserved, *always) if j in tested}
        tested -= self._lent
        return tested

    def ended(self, state: ClusterState, on_budget: bool, reserved: Iterable[str]) -> None:
        """After the cycle: continue the round (it stopped on the budget) or end it."""
        self._watermark = state.next_seq
        self.skimming, self.done = False, frozenset()
        self.tested |= self._lent
        self._lent = set()
        if on_budget:
            self.tested.update(self._taken)
            self.reserved = frozenset(reserved)
        else:
            self.reset()
        self._taken = []
