"""Fair share's order without a pass over the whole queue: per-team sorted queues, kept
from one cycle to the next, merged by the teams' current claims.

``fairshare.fair_share`` describes the order: repeatedly the head of the team with the
best claim, charged to its team as if placed. Built whole, that is a sort of every
waiting job and a charge and a re-rank per job, every cycle (~8 µs a job: 400 ms at
50,000 waiting), though a cycle on a full pool places a handful and stops early when
it may. Here the order is produced lazily, the job the cycle asks for next and no more:

* each team's waiting jobs are kept sorted in its within-team order (aged jobs by
  submission, then the others by priority class and submission) across cycles; a cycle
  brings them in step with ``state.pending`` (jobs that left are dropped, jobs that came
  are inserted: set differences, bisection) instead of sorting the queue again;
* the teams' heads sit in a heap keyed by their claim (``_Projection.claim``); taking a
  job charges its team, and only the claims that charge can move are re-keyed: its
  team's, and those of its org's other teams (as ``fair_share`` re-ranks them). Older
  heap entries of a re-keyed team are recognised by a version and dropped.

The cluster's capacity, which the teams' dominant shares are fractions of, is kept too
(``capacity``): summed over every node and GPU it was a third of a cycle's fixed cost at
5,000 nodes, though it changes only with the nodes the reducer journals
(``ClusterState.node_changes``: ``shares.KeptCapacity`` re-adds just those).

So a cycle costs O(jobs taken x log teams) plus the queue's changes, and the order is
the one ``fair_share`` builds: the same charges in the same order, so the same floats.
Claims end with the head's submission number, unique within a log, so two teams never
tie; the heap's second key, the team's rank, breaks ties as ``fair_share``'s ``min``
would anyway. (tests/unit/policies/queueing/test_fair_queue.py holds the order against the
whole-queue algorithm, kept there as the oracle.)
"""
from __future__ import annotations

import heapq
import math
from bisect import bisect_left, insort
from typing import AbstractSet, Iterable, Iterator, Mapping

from gpusched.core.priority import PRIORITY_CLASSES, priority_value
from gpusched.core.state import ClusterState, JobState
from gpusched.policies.journal_cursor import JournalCursor
from gpusched.policies.queueing.cursor import JobTestCursor
from gpusched.policies.queueing.shape_key import shape_key
from gpusched.policies.queueing.shares import (
    KeptCapacity, QueueContext, Vector, _Projection, cluster_capacity, is_aged, job_demand,
)
from gpusched.policies.queueing.tested_bounds import TestedBounds


class TeamQueues:
    """The waiting jobs of one pool state by team, each team's in within-team order.

    ``sync`` keeps them in step with ``state.pending`` between cycles (the caller keeps one
    per pool state, inside its ``QueueKeys``); ``fill`` loads a given set of jobs once.
    An entry is live while ``_members[job_id]`` is that very entry: a job that left the
    queue is dropped from ``_members`` at once and from the lists lazily, and an entry left
    behind never comes back to life if the job returns (it gets a new one)."""

    __slots__ = ("_journal", "_jobs", "_aging_s", "_now", "_watermark", "_members", "_aged", "_young",
                 "_ageing", "_dead", "_rank", "_ready_only", "_shape_of", "_census", "_shapes", "_tested", "cursor",
                 "jump", "_capacity")

    def __init__(self) -> None:
        self._journal = JournalCursor()           # the state synced, its journal read up to where
        self._jobs: Mapping[str, JobState] = {}
        self._aging_s = math.inf
        self._now = -math.inf
        self._watermark = 0                       # state.next_seq at the last sync
        self._capacity = KeptCapacity()
        self._members: dict[str, tuple] = {}      # job id -> its live entry
        self._aged: dict[str, list] = {}          # team -> [(seq, job id)], ascending
        self._young: dict[str, list] = {}         # team -> [(-priority, seq, job id)], ascending
        self._ageing: list = []                   # heap of young jobs by submission time
        self._dead = 0                            # list entries no longer live
        self._rank: dict[str, int] | None = None  # team -> first appearance (fill only)
        self._ready_only = True
        # The shapes (pool, workers, per-worker resources) of the live jobs, counted: what
        # the cycle needs to know that every job left in the queue is bound to fail. Keyed by
        # ``shape_key``, hashed in C (the dataclass's hash and eq, Python calls, were most of a
        # cold cycle); ``_shapes``: each key's shape, as ``shapes`` reports it.
        self._shape_of: dict[str, tuple] = {}
        self._census: dict[tuple, int] = {}
        self._shapes: dict[tuple, tuple] = {}
        # The round of cycles whose tested jobs a walk leaves out (set by ``QueueKeys``),
        # and how far each list holds only those (``tested_bounds``).
        self.cursor: JobTestCursor | None = None
        self._tested = TestedBounds()
        self.jump = True   # False: every entry is walked (the tests' reference)

    # --- keeping the queues -------------------------------------------------------------
    def fill(self, jobs: Iterable[JobState], now: float, aging_s: float) -> None:
        """Exactly ``jobs`` (in the caller's order, which ranks the teams), whatever their
        readiness: ``fair_share``'s input."""
        listed = {job.job_id: job for job in jobs}
        self._reset(listed, now, aging_s)
        self._rank = {}
        for job in listed.values():
            self._rank.setdefault(job.team, len(self._rank))
        self._ready_only = False
        self._insert(listed.values())

    def sync(self, state: ClusterState, now: float, aging_s: float) -> None:
        """Bring the queues in step with ``state.pending`` at ``now``."""
        if state is not self._journal.state or aging_s != self._aging_s or now < self._now:
            self._reset(state.jobs, now, aging_s)   # a new state, or time went back: start over
            self._insert(state.jobs[j] for j in state.pending)
            self._watermark = state.next_seq
            self._journal.start(state)
            return
        pending, members, jobs = state.pending, self._members, state.jobs
        gone, new = self._moved(state)
        for job_id in gone:
            del members[job_id]
            self._uncount(job_id)
        self._dead += len(gone)
        if state.next_seq != self._watermark:
            # Retention may free a job's id and a new job take it: the new one has a new seq.
            # Submissions since the last sync are the tail of ``state.jobs`` (a dict, in
            # submission order; an id dropped and submitted again goes to the end).
            for job_id in reversed(jobs):
                seq = jobs[job_id].seq
                if seq < self._watermark:
                    break
                entry = members.get(job_id)
                if entry is not None and entry[-2] != seq:
                    del members[job_id]
                    self._uncount(job_id)
                    self._dead += 1
                    new.add(job_id)
            self._watermark = state.next_seq
        self._now = now
        self._insert(jobs[j] for j in new)
        self._age(now)
        if self._dead > len(members) + 64:
            self._compact()
        else:
            self._trim()

    def _moved(self, state: ClusterState) -> tuple[list[str] | set[str], set[str]]:
        """The jobs that left the queue and those that came since the last sync: from the
        jobs the reducer journalled since (a job enters or leaves ``pending`` only by an
        event that journals it), not by comparing the whole queue with the members (10-14
        ms at 50,000 waiting). Where the journal was overrun, or the counts disagree
        after it (a state changed by other means than the reducer), the whole queue."""
        pending, members = state.pending, self._members
        read = self._journal.read_nodes(state, registered=True)   # None: overrun
        if read is not None:   # the nodes change no job's place in the queue; ``capacity`` reads them
            changed = dict.fromkeys(read[0])
            gone = [j for j in changed if j in members and j not in pending]
            new = {j for j in changed if j in pending and j not in members}
            if len(members) - len(gone) + len(new) == len(pending):
                return gone, new
        return members.keys() - pending.keys(), pending.keys() - members.keys()

    def _reset(self, jobs: Mapping[str, JobState], now: float, aging_s: float) -> None:
        self._jobs, self._aging_s, self._now = jobs, aging_s, now
        self._journal.forget()
        self._members, self._aged, self._young, self._ageing = {}, {}, {}, []
        self._dead, self._rank, self._ready_only = 0, None, True
        self._shape_of, self._census, self._shapes = {}, {}, {}
        self._capacity = KeptCapacity()
        self._tested.clear()

    def _uncount(self, job_id: str) -> None:
        shape = self._shape_of.pop(job_id)
        left = self._census[shape] - 1
        if left:
            self._census[shape] = left
        else:
            del self._census[shape]
            del self._shapes[shape]

    def capacity(self, state: ClusterState) -> Vector:
        """``cluster_capacity(state)``, kept for the synced state (``KeptCapacity``; a
        cycle's statement changes nodes only tentatively, after the order's projection
        read this)."""
        if state is not self._journal.state:
            return cluster_capacity(state)
        return self._capacity.of(state)

    def shapes(self) -> Iterable[tuple]:
        """The shapes of the jobs in the queues (ready or not): ``shape_key``s, pool first."""
        return self._shapes.values()

    def _insert(self, jobs: Iterable[JobState]) -> None:
        """Enter ``jobs`` (not yet live) into their teams' lists."""
        now, aging_s, members = self._now, self._aging_s, self._members
        shape_of, census, shapes = self._shape_of, self._census, self._shapes
        priority = PRIORITY_CLASSES.get   # ``priority_value`` and ``is_aged`` inlined: once per arrival
        aged: dict[str, list] = {}
        young: dict[str, list] = {}
        for job in jobs:
            spec = job.spec
            flat = shape_of[job.job_id] = shape_key(spec)
            count = census[flat] = census.get(flat, 0) + 1
            if count == 1:
                shapes[flat] = flat
            if now - job.submitted_at >= aging_s:
                entry = members[job.job_id] = (job.seq, job.job_id)
                aged.setdefault(job.team, []).append(entry)
            else:
                entry = members[job.job_id] = (-priority(spec.priority_class, 0), job.seq, job.job_id)
                young.setdefault(job.team, []).append(entry)
                if aging_s < math.inf:
                    heapq.heappush(self._ageing, (job.submitted_at, job.seq, job.job_id))
        for added, lists in ((aged, self._aged), (young, self._young)):
            for team, entries in added.items():
                target = lists.setdefault(team, [])
                for entry in entries:
                    self._tested.entered(lists is self._young, team, entry)
                # Many at once into a list not much longer: one sort beats as many insertions.
                # Into a long one (jobs arriving during a burst) it does not: the sort compares
                # every entry of the list, an insertion ~log n of them and moves the rest.
                if len(entries) > 16 and len(entries) * 32 > len(target):
                    target.extend(entries)
                    target.sort()
                else:
                    for entry in entries:
                        insort(target, entry)

    def _age(self, now: float) -> None:
        """Move the jobs that have waited ``aging_s`` since the last sync to the aged lists.
        Waiting time is monotone in submission time, so the heap's top ages first."""
        ageing, members, jobs, aging_s = self._ageing, self._members, self._jobs, self._aging_s
        while ageing and now - ageing[0][0] >= aging_s:
            _, seq, job_id = heapq.heappop(ageing)
            entry = members.get(job_id)
            if entry is None or len(entry) != 3 or entry[1] != seq:
                continue   # left the queue meanwhile
            young = self._young[jobs[job_id].team]
            i = bisect_left(young, entry)
            while young[i] is not entry:   # a dead entry of the same job may sort equal
                i += 1
            del young[i]
            aged = members[job_id] = (seq, job_id)
            insort(self._aged.setdefault(jobs[job_id].team, []), aged)
            self._tested.entered(False, jobs[job_id].team, aged)
        if len(ageing) > 2 * len(members) + 64:   # entries of jobs gone long ago
            self._ageing = [a for a in ageing if (e := members.get(a[2])) is not None and len(e) == 3]
            heapq.heapify(self._ageing)

    def _compact(self) -> None:
        members = self._members
        for lists in (self._aged, self._young):
            for team, entries in lists.items():
                lists[team] = [e for e in entries if members.get(e[-1]) is e]
        self._dead = 0

    def _trim(self) -> None:
        """Drop each list's leading dead entries: jobs placed from the head, the usual way out."""
        members = self._members
        for lists in (self._aged, self._young):
            for entries in lists.values():
                n = 0
                for entry in entries:
                    if members.get(entry[-1]) is entry:
                        break
                    n += 1
                if n:
                    del entries[:n]
                    self._dead -= n

    # --- the order ----------------------------------------------------------------------
    def order(self, state: ClusterState, now: float, context: QueueContext,
              passed: set[str] | None = None) -> Iterator[JobState]:
        """Fair share's order of the live jobs (after ``sync``: those ready at ``now``),
        nominees first. The projection is read from ``state`` now, before the caller books
        anything; the rest is produced as the caller asks for it. ``passed``: jobs the
        caller may add to while it takes the order, left out from then on (neither
        produced nor charged); so are the tested jobs of ``self.cursor``'s round once it
        says so (``skimming``, ``queueing.cursor``). A team's next job, drawn when its
        last was produced, may still come once."""
        aging_s = context.aging_s if context.aging_s > 0 else math.inf
        teams = [t for t in (*self._aged, *self._young)]
        projection = _Projection(state, context, teams, self.capacity(state))
        nominees = context.nominees
        rank = self._rank if self._rank is not None else self._ready_rank(state, now, nominees)
        first = self._nominees(nominees, rank, now) if nominees else []
        if passed is not None:
            passed.update(nominees)
        return self._merge(projection, first, rank, now, aging_s, nominees if passed is None else passed)

    def _ready(self, job: JobState, now: float) -> bool:
        return not self._ready_only or job.not_before <= now

    def _live(self, team: str, now: float, skip: AbstractSet[str]) -> Iterator[JobState]:
        """``team``'s live, ready jobs in within-team order, but those in ``skip`` and, once the
        cursor leaves them out, its round's tested jobs: each list is then taken from its
        bound on (``tested_bounds``)."""
        members, jobs, ready_only, cursor = self._members, self._jobs, self._ready_only, self.cursor
        for young, lists in ((False, self._aged), (True, self._young)):
            entries = lists.get(team, ())
            i, n, deciding, bound = 0, len(entries), cursor is not None, None
            done: AbstractSet[str] = frozenset()
            while i < n:
                if deciding and cursor.skimming and (d := self._tested.done(cursor, members, jobs)) is not None:
                    deciding, done = False, d
                    if not self.jump:
                        continue
                    i, bound, exceptions = self._tested.enter(young, team, entries, i, members, d)
                    for entry in exceptions:
                        job = jobs[entry[-1]]
                        if members.get(job.job_id) is entry and job.job_id not in skip and job.job_id not in d \
                                and not (ready_only and job.not_before > now):
                            yield job
                    continue
                entry = entries[i]
                i += 1
                job_id = entry[-1]
                if bound is not None:   # at the bound: it moves over dead and tested entries
                    bound = self._tested.step(bound, entries, i, members, done)
                if members.get(job_id) is not entry or job_id in skip or job_id in done:
                    continue
                job = jobs[job_id]
                if ready_only and job.not_before > now:
                    continue
                yield job

    def _ready_rank(self, state: ClusterState, now: float, nominees: frozenset[str]) -> dict[str, int]:
        """Teams by first appearance among the ready jobs in ``state.pending``'s order, as
        ``fair_share`` meets them: what orders the nominees' teams (ties of claims cannot
        happen, see above). Only needed, and only computed, with nominees."""
        rank: dict[str, int] = {}
        if not nominees:
            return rank
        wanted = {self._jobs[j].team for j in nominees if j in self._members}
        jobs = self._jobs
        for job_id in state.pending:
            job = jobs[job_id]
            if job.not_before <= now and job.team not in rank:
                rank[job.team] = len(rank)
                if wanted.issubset(rank):
                    break
        return rank

    def _nominees(self, nominees: frozenset[str], rank: dict[str, int], now: float) -> list[JobState]:
        """The live, ready nominees: by their team's rank, then within-team order."""
        jobs, aging_s = self._jobs, self._aging_s
        chosen = [jobs[j] for j in nominees if j in self._members]
        chosen = [j for j in chosen if self._ready(j, now)]

        def key(job: JobState) -> tuple:
            within = (0, job.seq) if is_aged(job, now, aging_s) else \
                (1, -priority_value(job.spec.priority_class), job.seq)
            return (rank.get(job.team, math.inf), within)
        return sorted(chosen, key=key)

    def _merge(self, projection: _Projection, first: list[JobState], rank: dict[str, int], now: float,
               aging_s: float, skip: AbstractSet[str]) -> Iterator[JobState]:
        charge, claim = projection.charge, projection.claim
        for job in first:
            charge(job, job_demand(job))
            yield job
        heads: dict[str, list] = {}   # team -> [its live jobs, head, version, rank]
        heap = []
        teams = sorted({*self._aged, *self._young}, key=lambda t: (rank.get(t, math.inf), t))
        for index, team in enumerate(teams):
            live = self._live(team, now, skip)
            head = next(live, None)
            if head is not None:
                heads[team] = [live, head, 0, index]
                heap.append((claim(head, head.milli, now, aging_s), index, 0, team))
        heapq.heapify(heap)
        org_of = {team: projection.teams[team].org for team in heads}
        org_teams: dict[str, list[str]] = {}
        for team, org in org_of.items():
            if org:
                org_teams.setdefault(org, []).append(team)
        pop, push = heapq.heappop, heapq.heappush
        while heap:
            _, _, version, team = pop(heap)
            entry = heads.get(team)
            if entry is None or entry[2] != version:
                continue   # a claim since re-keyed, or a team run dry
            job = entry[1]
            charge(job, job_demand(job))
            yield job
            following = next(entry[0], None)
            if following is None:
                del heads[team]
            else:
                entry[1] = following
            # The charge moved this team's shares and its org's: re-key the org's teams.
            org = org_of[team]
            for other in (org_teams[org] if org else (team,)):
                e = heads.get(other)
                if e is not None:
                    e[2] += 1
                    head = e[1]
                    push(heap, (claim(head, head.milli, now, aging_s), e[3], e[2], other))
