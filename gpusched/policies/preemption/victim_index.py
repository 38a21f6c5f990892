"""The preemptor's index of candidate victims, kept from one round to the next, so that
neither a decision's search nor a round's start reads the whole pool.

``VictimIndex`` lists the running jobs that may be victims at all (``now`` as the round
has it): each once per node it runs on, in two kinds of lists:

* for priority: jobs past their exempt time and within their budget (victims of any
  pending job of a higher class);
* for quota reclaim, one list per team: jobs past ``reclaim_min_runtime_s`` and not
  reclaimed within ``reclaim_window_s`` (victims of a reclaiming job of another team, of
  its class or lower, when wholly above their team's guarantee: decided at the question,
  as borrowing changes with the round's decisions).

Which list a job is on is the rule's (``victim_rules``: ``may_be_victim``, then
``victim_listing``); which lists a pending job may take from too (``lower_class``,
``reclaimable_class``, in ``victim_groups``); the index asks each listed victim's
``shield`` at the question, so a rule that only keeps more jobs from being victims
changes nothing here.

``candidates`` merges the lists a pending job may take from by ``bound``, a lower bound of
the rank (``set_key``) of any victim set in which the job is of the highest class: the
search (``indexed_search``) looks at nodes in that order and stops at the first bound
above the best set found (the bound is the rule's: ``victim_rules.set_key_bound``). Among equal bounds, nodes running a preemptible job spread over
several nodes (listed or not yet) come first (``spread``: a step there may gain slots on
the other nodes too), then by name.

A bound is the job's class and the GPU-seconds it would lose, which grow with ``now``,
at a rate of its GPUs: so each list is kept in groups of one class and one size, each
ordered by the time its work began (later first, a job never started first), an order
``now`` does not change; ``candidates`` merges the groups by their bounds at ``now``.

Kept between rounds (``refresh``), the index follows the reducer's journal of changed jobs
(``ClusterState.changes``) as the placer's kept indexes do (``touched_nodes``): on the
nodes a journalled job held or holds, its entries are listed again (all the node's where
its spread flag changed), and every entry of the nodes the reducer journalled as
changed by themselves (``ClusterState.node_changes``: registered, lost, cordoned,
uncordoned, a GPU's health; a node added joins there); a job younger than its exempt time (or
recently reclaimed) waits in a heap by when it becomes a victim (``victim_timing``). Other
rules, another state, a clock gone back or a journal dropped unread rebuild it. The groups
and each node's entries in them are ``victim_groups``'.

The index also keeps what the round would otherwise sum over the pool: the teams' running
jobs and their rankings (``borrowing``, told of the jobs that join or leave), the worker
slots of each job shape searched (``SlotCounts``, told of the nodes that changed or whose
bookings did, and of those a round's scratch changed once it is undone: ``count_again``;
a checkpoint, a start or a preemption notice books nothing), and for each node the
most GPUs it could have free with every listed job of a class below a given one gone
(``most_freeable``), so that a search which no victim set can satisfy ends at once.
"""
from __future__ import annotations

import math
from typing import Iterable, Iterator

from gpusched.core.model import JobPhase
from gpusched.core.state import ClusterState, JobState, NodeState
from gpusched.policies.journal_cursor import JournalCursor
from gpusched.policies.preemption.borrowing import TeamRanking
from gpusched.policies.preemption.freeable import CLASSES, MostFreeable, freeable_vector
from gpusched.policies.preemption.slot_counts import SlotCounts
from gpusched.policies.preemption.victim_groups import Entry, VictimGroups, bound
from gpusched.policies.preemption.victim_rules import listing_rules, may_be_victim, victim_listing
from gpusched.policies.preemption.victim_timing import Waiting

__all__ = ["CLASSES", "Entry", "VictimIndex", "bound"]
_RUNNING, _PLACED = JobPhase.RUNNING, JobPhase.PLACED


class VictimIndex:
    """Candidate victims of every pool of one state, kept between rounds (see the module doc)."""

    def __init__(self) -> None:
        self.journal = JournalCursor()   # the state indexed, its journal read up to where
        self._reset(None, -math.inf)

    def _reset(self, config, now: float) -> None:
        self.config, self.now = config, now
        self._rules = listing_rules(config) if config is not None else None
        self._slots: dict[tuple, SlotCounts] = {}   # job shape -> its worker slots
        self._jobs: dict[str, JobState] = {}   # every job noted on a node
        self._job_nodes: dict[str, tuple[str, ...]] = {}
        self._booked: dict[str, tuple] = {}   # job -> (attempt, workers) as noted
        self._listed: dict[str, list[bool]] = {}    # job -> [for priority, for reclaim]
        self._waiting = Waiting()   # jobs not yet listed, by when they will be
        self._lists = VictimGroups()
        self.spread = self._lists.spread   # nodes running a listed job spread over several
        self.preempting: dict[str, str] = {}   # PREEMPTING job on a node -> the job it is preempted for
        self.teams: dict[str, dict[str, JobState]] = {}      # team -> its RUNNING or PLACED jobs
        self._team_lists: dict[str, list[JobState]] = {}
        self.rankings: dict[str, TeamRanking] = {}   # team -> its ranking, made by ``TeamLedger``
        self._freeable = MostFreeable()

    # --- the round's questions ------------------------------------------------------------
    def candidates(self, pool: str, mine: int, team: str, reclaim: bool) -> Iterator[Entry]:
        """Entries a pending job of class ``mine`` and ``team`` may take victims from
        (``reclaim``: it may reclaim its guarantee), by bound; a superset of its eligible
        victims on their nodes."""
        return self._lists.candidates(pool, mine, team, reclaim, self.now)

    def most_freeable(self, pool: str, mine: int, reclaim: bool, changed: Iterable[str] = ()) -> int | None:
        """The most GPUs any node of ``pool`` could have free once every job a pending job
        of class ``mine`` may take from (``candidates``) were gone; None when unknown.
        ``changed``: the nodes a round's scratch changed, counted here with all their GPUs,
        as an earlier decision's victims may have freed GPUs the job could not take itself."""
        most = self._freeable.most(pool, mine, reclaim)
        if most is None:
            return None
        nodes = self.journal.state.nodes if self.journal.state is not None else {}
        return max(most, max((len(nodes[name].gpus) for name in changed if name in nodes), default=0))

    def slot_counts(self, shape: tuple, changed: Iterable[str]) -> SlotCounts:
        """The worker slots of ``shape`` (``SlotCounts``, pool, resources, workers), kept
        between rounds; ``changed``: the nodes the round's scratch changed so far."""
        counts = self._slots.get(shape)
        if counts is None:
            _, pool, res, workers = shape
            counts = self._slots[shape] = SlotCounts(self.journal.state.nodes, pool, res, workers)
        else:
            counts.touch(changed)
        return counts

    def count_again(self, names: Iterable[str]) -> None:
        """The round's scratch changed ``names`` and is undone: count them again."""
        for counts in self._slots.values():
            counts.touch(names)

    def team_jobs(self) -> dict[str, list[JobState]]:
        """Each team's RUNNING or PLACED jobs: its usage, its borrowing."""
        lists = self._team_lists
        for team, jobs in self.teams.items():
            if team not in lists:
                lists[team] = list(jobs.values())
        return {team: lists[team] for team in self.teams}

    # --- keeping it in step ---------------------------------------------------------------
    def refresh(self, state: ClusterState, now: float, config) -> "VictimIndex":
        """Bring the index in step with ``state`` at ``now`` under ``config`` (the round's
        ``PreemptionConfig``)."""
        read = self.journal.read_nodes(state, registered=True)   # None: another state, or overrun
        if read is None or now < self.now or listing_rules(config) != self._rules:
            self._reset(config, now)
            relist: dict[str, set[str] | None] = dict.fromkeys(state.nodes)
            fresh, recount, refree = True, set(), set()
        else:
            self.config, self.now, fresh = config, now, False
            relist, recount, refree = self._journalled_nodes(state, read[0])
            relist.update(dict.fromkeys(read[1]))   # every entry of a node changed by itself
            recount.update(read[1])
        self._come_due(now, relist, refree)
        self._relist(relist, refree, state, fresh)
        for counts in self._slots.values():
            counts.touch(recount, registered=True)
        return self

    def _journalled_nodes(self, state: ClusterState, journalled: list[str]) -> tuple[dict, set[str], set[str]]:
        """The nodes whose jobs changed, each with those jobs: the nodes held before, or
        held now, by a job the reducer journalled since the last refresh
        (``ClusterState.changes``; each noted again), as ``touched_nodes`` reads them for
        the placer's kept indexes. And of those, the nodes whose bookings changed (a job
        booked, released or booked again: the reducer books and releases only then), the
        only ones whose worker slots may have; and those where besides a job's lists
        changed, the only ones whose freeable GPUs may have (``freeable_vector``)."""
        relist: dict[str, set[str] | None] = {}
        recount: set[str] = set()
        refree: set[str] = set()
        known, jobs, booked, listed = self._jobs, state.jobs, self._booked, self._listed
        for jid in dict.fromkeys(journalled):
            was = known.get(jid)
            if was is not None:
                nodes, held, lists = self._job_nodes[jid], booked.get(jid), listed.get(jid)
                self._take_in(was)   # lists a job anew: its list of flags a new one
                nodes += self._job_nodes.get(jid, ())
                if booked.get(jid) != held:
                    recount.update(nodes)
                    refree.update(nodes)
                elif listed.get(jid) != lists:
                    refree.update(nodes)
            elif (job := jobs.get(jid)) is not None and job.phase.holds_gpus:
                nodes = tuple(w.node for w in job.workers if w.node in state.nodes)
                recount.update(nodes)
                refree.update(nodes)
            else:
                continue
            for name in nodes:
                only = relist.get(name)
                if only is None:
                    only = relist[name] = set()
                only.add(jid)
        return relist, recount, refree

    def _take_in(self, job: JobState) -> None:
        """Note ``job`` as it is now: on nodes or gone from them, its team, its lists."""
        jid, team = job.job_id, job.team
        mates, ranking = self.teams.get(team), self.rankings.get(team)
        if mates is not None and mates.pop(jid, None) is not None:
            self._team_lists.pop(team, None)
            if ranking is not None:
                ranking.drop(jid)
            if not mates:
                del self.teams[team]
        self._listed.pop(jid, None)
        self.preempting.pop(jid, None)
        self._waiting.forget(jid)
        if not job.phase.holds_gpus:
            self._jobs.pop(jid, None)
            self._job_nodes.pop(jid, None)
            self._booked.pop(jid, None)
            return
        self._note(job)

    def _note(self, job: JobState) -> None:
        """Note ``job``, which holds GPUs and is not noted (or was forgotten by ``_take_in``):
        where it runs, its team, its lists."""
        jid, phase, workers = job.job_id, job.phase, job.workers
        self._jobs[jid] = job
        self._booked[jid] = (job.attempt, workers)
        self._job_nodes[jid] = (workers[0].node,) if len(workers) == 1 else tuple(dict.fromkeys(w.node for w in workers))
        if phase is not _RUNNING and phase is not _PLACED:
            if phase is JobPhase.PREEMPTING and job.nominated_by:
                self.preempting[jid] = job.nominated_by
            return
        team = job.spec.team
        mates = self.teams.get(team)
        if mates is None:
            mates = self.teams[team] = {}
        mates[jid] = job
        self._team_lists.pop(team, None)
        ranking = self.rankings.get(team)
        if ranking is not None:
            ranking.add(job)
        if may_be_victim(job):
            self._list_by_time(job)

    def _list_by_time(self, job: JobState) -> None:
        """Whether ``job`` is listed now for priority and for reclaim; when not, when it will be."""
        yes, priority_due, reclaim_due = victim_listing(job, self.config, self.now)
        self._listed[job.job_id] = yes
        self._waiting.wait(job.job_id, yes, priority_due, reclaim_due)

    def _come_due(self, now: float, relist: dict[str, set[str] | None], refree: set[str]) -> None:
        """List the jobs whose exempt time or reclaim window ended by ``now``."""
        for jid, kind in self._waiting.come_due(now, self.config, self.journal.state.jobs):
            self._listed[jid][kind] = True
            refree.update(self._job_nodes[jid])
            for name in self._job_nodes[jid]:
                if name not in relist:
                    relist[name] = {jid}
                elif (only := relist[name]) is not None:
                    only.add(jid)

    def _relist(self, names: dict[str, set[str] | None], refree: set[str], state: ClusterState,
                fresh: bool = False) -> None:
        """List again the entries of the nodes ``names``: of the jobs named with a node,
        or all where None (or where the node's spread flag, which every entry holds,
        changed); an entry as it was stays, the others leave or join their groups, each
        group edited once (``fresh``: the index was reset, every node is listed into
        empty groups, each sorted once). A node's freeable GPUs are counted again where
        all its entries are, or it is in ``refree``."""
        lists, gone, added = self._lists, [], []
        for name, only in names.items():
            node = state.nodes.get(name)
            if node is None:
                was, _ = lists.take_off(name)
                self._freeable.count(name, None)
            else:
                here, spread = self._here(node, state)
                if only is not None and spread != (name in lists.spread):
                    only = None
                was, kept = lists.take_off(name, only)
                lists.put_on(node, here if only is None else [j for j in here if j.job_id in only],
                             self._listed, spread, was, added, kept)
                if only is None or name in refree:
                    self._freeable.count(name, (node.info.pool, freeable_vector(node, here, self._listed)))
            for pairs in was.values():
                gone.extend(pairs)
        lists.settle(gone, added, fresh)

    def _here(self, node: NodeState, state: ClusterState) -> tuple[list[JobState], bool]:
        """The jobs on ``node`` (noted if new), and whether a listed one runs on other nodes too."""
        jobs, known, job_nodes, listed = state.jobs, self._jobs, self._job_nodes, self._listed
        here: list[JobState] = []
        spread = False
        for jid in node.jobs:
            job = jobs[jid]
            if jid not in known:
                self._note(job)
            here.append(job)
            if not spread and jid in listed and len(job_nodes[jid]) > 1:
                spread = True
        return here, spread

