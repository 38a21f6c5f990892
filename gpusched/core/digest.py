"""A digest of the state: two replicas that applied the same log prefix must agree on it."""
from __future__ import annotations

import hashlib
import json

from gpusched.core.policy import Quota
from gpusched.core.model import PendingKind
from gpusched.core.state import ClusterState, GpuState, JobState


def _gpu(g: GpuState) -> list:
    # GPU memory only when booked: digests of states without it stay what they were
    return [g.healthy, g.used_milli, g.mig_mask] + ([g.used_memory_mib] if g.used_memory_mib else [])


def _pending_reason(job: JobState) -> list:
    # only once one is set: digests of states without pending reasons stay what they were
    r = job.pending_reason
    if r.kind is PendingKind.NONE:
        return []
    return [[r.kind.value, r.summary, r.nodes, [[c.filter, c.nodes] for c in r.counts], job.pending_reason_at]]


def _rule_restarts(job: JobState) -> list:
    # only where a retry rule has a budget of its own. ``job.failures`` is left out: a
    # history for the API, kept from events every digest covers, and a digest of an older
    # log (tests/fixtures/logs) must stay the one recorded when it was written.
    return [sorted(job.rule_restarts.items())] if job.rule_restarts else []


def _array(job: JobState) -> list:
    # only for arrays and their tasks: other digests stay what they were
    if job.array_tasks:
        return [[len(job.array_tasks), job.array_released, job.array_running, job.array_ended, job.array_failed]]
    return [[job.array_of, job.array_index]] if job.array_of else []


def canonical(state: ClusterState) -> dict:
    nodes = {
        name: [n.status.value, n.cordoned, n.used_cpu, n.used_mem, n.faults, sorted(n.jobs),
               [_gpu(g) for g in n.gpus]]
        for name, n in sorted(state.nodes.items())
    }
    jobs = {
        jid: [j.phase.value, j.attempt, j.reason, j.seq, j.restarts, j.preemptions,
              j.checkpoint, sorted(j.started), sorted(j.finished.items()),
              [[w.worker, w.node, [[s.index, s.milli, s.mig_profile, s.mig_start] for s in w.gpus]]
               for w in j.workers]] + _pending_reason(j) + _rule_restarts(j)
              + ([list(j.waiting_for)] if j.waiting_for else []) + _array(j)
        for jid, j in sorted(state.jobs.items())
    }
    usage = {t: [u.gpu_milli, u.cpu_milli, u.memory_mib, u.jobs] for t, u in sorted(state.usage.items())
             if u.gpu_milli or u.cpu_milli or u.memory_mib or u.jobs}
    nominations = {j: [list(n), t] for j, (n, t) in sorted(state.nominations.items())}
    extra = {}
    in_use = {n.info.pool for n in state.nodes.values()}
    if any(p not in in_use for p in state.pools):   # created by an operator: else digests stay as they were
        extra["pools"] = sorted(state.pools)
    doc = {**extra, "nodes": nodes, "jobs": jobs, "usage": usage, "pending": list(state.pending),
           "nominations": nominations,
           "pruned": state.pruned, "applied": state.applied, "rejected": state.rejected, "dedupe": state.dedupe.ids()[-64:]}
    doc["ledger"] = {t: [e.at, e.gpu_milli, e.cpu_milli, e.memory_mib] for t, e in sorted(state.ledger.items())}
    if state.dependents:   # only while a job waits for another, so other digests are unchanged
        doc["dependents"] = {j: list(w) for j, w in sorted(state.dependents.items())}
    if state.services:   # only where services exist, so other digests are unchanged
        doc["services"] = {n: [v.desired, v.revision, sorted(v.templates), list(v.replicas.items()),
                               sorted(v.ready.items()), v.replaced, v.scaled_reason]
                           + ([v.crash_loop] if v.crash_loop else [])   # so other digests are unchanged
                           for n, v in sorted(state.services.items())}
    if state.pool_topology:   # only once a pool declares levels, so other digests are unchanged
        doc["topology"] = {p: list(levels) for p, levels in sorted(state.pool_topology.items())}
    if state.policy_version:   # only once some policy is set, so other digests are unchanged
        doc["policy"] = _policy(state)
    return doc


def _policy(state: ClusterState) -> dict:
    def quota(q: Quota) -> list:
        return [q.org, q.team, q.guaranteed_milli, q.limit_milli, q.borrowing, q.lending_limit_milli, q.weight]
    return {"orgs": {o: quota(q) for o, q in sorted(state.org_quotas.items())},
            "teams": {t: quota(q) for t, q in sorted(state.team_quotas.items())},
            "policies": {t: [p.weight, list(p.priority_classes), list(p.pools)]
                         for t, p in sorted(state.team_policies.items())}}


def digest(state: ClusterState) -> str:
    blob = json.dumps(canonical(state), separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()
