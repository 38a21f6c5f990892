"""FGD's task mix: the pool's pending and running jobs counted by request (``raw_counts``;
``fragmentation.typical_of`` reduces the count to the typical shapes), and that count
kept from one cycle to the next (``KeptMix``).

Counting reads every pending job: at 50,000 pending that is a tenth of an FGD cycle
that tests 2,500 jobs, though between two cycles only the jobs the reducer journalled
(``ClusterState.changes``: submitted, placed, ended, requeued) can count differently.
``KeptMix`` keeps each counted job's request (those pending when it counted everything
read from the reducer's count, ``ClusterState.pending_counts``, and from the job when the
journal names one) and, at a cycle's start, recounts only those; an overrun journal or
another state count everything again. A node event counts no job differently by itself:
a running job counts where its node is of the pool, and a node changes pool only while it
runs nothing (the reducer refuses it otherwise); what a node's loss ends is journalled
as the jobs it ends. The mix it gives is the one counting afresh gives
(``tests/unit/policies/placement/fgd/test_task_mix.py``), so FGD decides alike.
"""
from __future__ import annotations

from collections import Counter
from operator import attrgetter
from typing import Iterable, Mapping

from gpusched.core.state import ClusterState, JobState
from gpusched.policies.gpu_fit import StateLike
from gpusched.policies.journal_cursor import JournalCursor
from gpusched.policies.placement.fgd.fragmentation import POPULARITY, Fields, Shape, typical_of
from gpusched.policies.placement.kept_index import KEPT, view
from gpusched.policies.statement import LENT, LentState, Statement

_FIELDS = attrgetter("cpu_milli", "gpu_milli", "gpus", "gpu_models", "mig_profile")
_RESOURCES = attrgetter("resources")


def counted_ids(state: StateLike, pool: str) -> list[str]:
    """The jobs the mix counts (those of another pool aside): pending, then holding a
    node of ``pool``; each once (a gang's workers share nodes, and a job may be both
    pending and placed)."""
    pending = getattr(state, "pending", ())
    if not isinstance(pending, (dict, set, frozenset)):
        pending = dict.fromkeys(pending)
    return [*pending, *held_ids(state, pool, pending)]


def held_ids(state: StateLike, pool: str, pending) -> dict[str, None]:
    """The jobs on ``pool``'s nodes that are not ``pending``, each once."""
    return dict.fromkeys(j for node in state.nodes.values() if node.info.pool == pool
                         for j in node.jobs if j not in pending)


def raw_counts(state: StateLike, pool: str) -> Counter[Fields]:
    """Workers of the counted jobs by request fields (``_FIELDS``)."""
    kept = _kept_pending(state)
    if kept is not None:
        return _from_kept(state, pool, kept)
    jobs: Mapping[str, JobState] = getattr(state, "jobs", {})
    # Every pending job passes here: the loop is C's (map, attrgetter, Counter), over the
    # requests' raw fields, and only the few distinct ones become shapes.
    specs = [spec for job in map(jobs.get, counted_ids(state, pool))
             if job is not None and (spec := job.spec).pool == pool]
    # Jobs of one worker counted by their fields alone (a tuple less to build and hash
    # per job), the workers beyond the first of the others added after.
    raw = Counter(map(_FIELDS, map(_RESOURCES, specs)))
    for spec in [spec for spec in specs if spec.workers != 1]:
        raw[_FIELDS(spec.resources)] += spec.workers - 1
    return raw


def typical_shapes(state: StateLike, pool: str, popularity: float = POPULARITY) -> dict[Shape, float]:
    """The pool's current workload (pending jobs and jobs holding GPUs), one count per
    worker, reduced to the most frequent shapes covering ``popularity`` of them, with
    their frequencies (summing to 1). Empty when the state has no jobs to look at."""
    return typical_of(raw_counts(state, pool), popularity)


def _kept_pending(state: StateLike) -> dict | None:
    """The reducer's count of the pending jobs by request (``ClusterState.pending_counts``),
    or None where the state keeps none, or one that does not cover ``pending`` (a state
    whose pending jobs were set by hand, not folded)."""
    kept = getattr(state, "pending_counts", None)
    pending = getattr(state, "pending", None)
    if kept is None or not isinstance(pending, dict) or sum(kept.values()) != len(pending):
        return None
    return kept


def _from_kept(state: StateLike, pool: str, kept: dict) -> Counter[Fields]:
    """``raw_counts`` from the reducer's count of pending jobs, and the jobs on the pool's
    nodes that are not pending read one by one: a pass over the running jobs, not over
    every pending one (at 50,000 pending that pass was a tenth of an FGD cycle)."""
    raw = _pending_of(pool, kept)
    jobs: Mapping[str, JobState] = state.jobs   # type: ignore[attr-defined]
    for job in map(jobs.get, held_ids(state, pool, state.pending)):   # type: ignore[attr-defined]
        if job is not None and (spec := job.spec).pool == pool:
            raw[_FIELDS(spec.resources)] += spec.workers
    return raw


def _pending_of(pool: str, kept: dict) -> Counter[Fields]:
    """Workers of ``pool``'s pending jobs by request fields, from the reducer's count."""
    raw: Counter[Fields] = Counter()
    for (job_pool, workers, *fields), n in kept.items():
        if job_pool == pool:
            raw[tuple(fields)] += n * workers
    return raw


class KeptMix:
    """``raw_counts`` of one pool of one state, kept between cycles and brought in step
    from the reducer's journal. A statement view (``kept_index.view`` keeps it with the
    placement indexes): the nodes a statement touches change no count, so ``touch`` is
    nothing."""

    __slots__ = ("pool", "journal", "raw", "counted", "unlisted")

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self.journal = JournalCursor()
        self.raw: Counter[Fields] = Counter()
        self.counted: dict[str, tuple[Fields, int]] = {}   # job -> (its fields, its workers) counted
        # Jobs pending at the last ``_start`` and counted there from the reducer's count
        # (``ClusterState.pending_counts``), not listed in ``counted``: a job's request
        # never changes, so its fields are read from the job when the journal names it.
        self.unlisted: set[str] = set()

    def touch(self, names: Iterable[str]) -> None:
        """Bookings, holds and cordons count no job differently."""

    def renew(self, names: Iterable[str]) -> None:
        """Nor do registrations (see the module doc)."""

    def counts(self, state: ClusterState) -> Counter[Fields]:
        """``raw_counts(state, pool)``: call while ``state`` is the log's (no tentative
        change made yet), as a cycle's start is."""
        read = self.journal.read_nodes(state, registered=True)   # the nodes: see the module doc
        if read is None:
            self._start(state)
        else:
            for job_id in dict.fromkeys(read[0]):
                self._recount(state, job_id)
        return self.raw

    def _recount(self, state: ClusterState, job_id: str) -> None:
        raw, counted = self.raw, self.counted
        was = counted.pop(job_id, None)
        if was is None and job_id in self.unlisted:
            self.unlisted.discard(job_id)
            gone = state.jobs.get(job_id)
            if gone is None:   # pruned: what it counted for is not known; count all again
                self._start(state)
                return
            if gone.spec.pool == self.pool:
                was = _FIELDS(gone.spec.resources), gone.spec.workers
        if was is not None:
            fields, n = was
            left = raw[fields] - n
            if left:
                raw[fields] = left
            else:
                del raw[fields]   # a shape no job asks for any more is no shape of the mix
        job = state.jobs.get(job_id)
        if job is None or job.spec.pool != self.pool or not self._counts(state, job):
            return
        fields, n = _FIELDS(job.spec.resources), job.spec.workers
        counted[job_id] = (fields, n)
        raw[fields] += n

    def _counts(self, state: ClusterState, job: JobState) -> bool:
        """Whether ``counted_ids`` has ``job``: pending, or on a node of the pool."""
        if job.job_id in state.pending:
            return True
        nodes = state.nodes
        return any(job.job_id in nodes[w.node].jobs and nodes[w.node].info.pool == self.pool
                   for w in job.workers if w.node in nodes)

    def _start(self, state: ClusterState) -> None:
        """Count everything: the pending jobs from the reducer's count where it covers
        them (a few requests, not 50,000 jobs read one by one), else one by one too."""
        jobs, pool = state.jobs, self.pool
        kept = _kept_pending(state)
        self.unlisted = set() if kept is None else set(state.pending)
        ids = counted_ids(state, pool) if kept is None else held_ids(state, pool, state.pending)
        counted: dict[str, tuple[Fields, int]] = {}
        for job in map(jobs.get, ids):
            if job is not None and (spec := job.spec).pool == pool:
                counted[job.job_id] = (_FIELDS(spec.resources), spec.workers)
        self.counted = counted
        raw: Counter[Fields] = Counter() if kept is None else _pending_of(pool, kept)
        for fields, n in counted.values():
            raw[fields] += n
        self.raw = raw


def fix_mixes(lent: LentState, statement: Statement) -> None:
    """Count every pool's mix of the lent state as it is now, once for ``statement``
    (``lent.memo``, read by ``pool_mix``); call while the lent state is the log's.
    Brought in step from the count kept (``KeptMix``) where ``statement`` was lent kept
    indexes (``KeptIndexes.install``), else counted afresh."""
    state = lent.state
    pools = dict.fromkeys(state.pools)
    pools.update(dict.fromkeys(node.info.pool for node in state.nodes.values()))
    for pool in pools:
        if KEPT in statement.views:
            kept = view(statement, ("fgd-mix", pool), lambda: KeptMix(pool))
            raw = kept.counts(state)   # type: ignore[attr-defined]
        else:
            raw = raw_counts(state, pool)
        lent.memo[("fgd-mix", pool)] = raw


def pool_mix(state: StateLike, statement: Statement, pool: str, popularity: float) -> dict[Shape, float]:
    """``typical_shapes`` of ``pool``: the count of the state lent to the statement
    (``fix_mixes``), or the count kept between cycles where the cycle keeps its indexes
    and has changed nothing yet, else counted afresh."""
    lent = statement.views.get(LENT)
    if lent is not None:
        memo = lent.memo   # type: ignore[attr-defined]
        raw = memo.get(("fgd-mix", pool))
        if raw is None:   # a pool counted after the lending (no policy counted it then)
            raw = memo[("fgd-mix", pool)] = raw_counts(lent.state, pool)   # type: ignore[attr-defined]
        return typical_of(raw, popularity)
    if KEPT in statement.views and statement.checkpoint() == 0 and isinstance(state, ClusterState):
        kept = view(statement, ("fgd-mix", pool), lambda: KeptMix(pool))
        return typical_of(kept.counts(state), popularity)   # type: ignore[attr-defined]
    return typical_of(raw_counts(state, pool), popularity)
