"""Node-agent reports: each agent writes its events to its own topic,
``<prefix>reports.<node>``, which only its principal may write (docs/reference/kafka-security.md).
The relay (``gpusched.adapters.nodes.relay``) appends to the pool log only what ``check_report``
lets through: the kinds of event an agent emits, about its own node's work.

The checks are pure: they read a ``ClusterState`` and an event, nothing else, so they are
tested without a broker (tests/unit/adapters/test_reports.py).
"""
from __future__ import annotations

import asyncio
import logging
import re
from typing import Awaitable, Callable

from gpusched.core import events as ev
from gpusched.core.state import ClusterState

log = logging.getLogger("gpusched.node_agent")
REPORTS = "reports."
BEATS = "beats."
# A node host (many simulated nodes in one process, ``gpusched node-host``) reports for all
# of them on ``<prefix>hostreports.<host>``, each record naming its node in NODE_HEADER,
# and beats for all of them in one ``HostBeats`` record on ``<prefix>hostbeats.<host>``.
# The host's topic is its identity; it may speak only for nodes named ``<host>-...``.
HOST_REPORTS = "hostreports."
HOST_BEATS = "hostbeats."
NODE_HEADER = "gpusched-node"
# A usage record on a report topic carries this header; the relay forwards it to
# ``<prefix>usage`` rather than to the pool log.
KIND_HEADER, USAGE_KIND = "gpusched-kind", b"usage"
# Kafka topic names allow [a-zA-Z0-9._-] and at most 249 characters; the node's name is
# the last part of its report topic and of its principal ``node-agent.<node>``.
_NODE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}")

# Events about one attempt's workers; the other agent kinds are about the node itself.
_ATTEMPT_KINDS = (ev.WorkerStarted, ev.WorkerFinished, ev.AttemptFailed, ev.CheckpointSaved, ev.RendezvousSet,
                  ev.ReplicaReadiness)
# An agent cordons its own node when a worker outlives SIGKILL (services/node-agent).
AGENT_KINDS = (ev.NodeRegistered, ev.GpuHealthChanged, ev.NodeCordoned, *_ATTEMPT_KINDS)


def check_node_name(node: str) -> str:
    """The name, or ValueError naming what a report topic and principal cannot carry."""
    if not _NODE_NAME.fullmatch(node):
        raise ValueError(f"node name {node!r}: a node's report topic and Kafka principal need 1-200 characters "
                         "of A-Z a-z 0-9 . _ - (not starting with a dot)")
    return node


def report_topic(prefix: str, node: str) -> str:
    return f"{prefix}{REPORTS}{check_node_name(node)}"


def beats_topic(prefix: str, node: str) -> str:
    """The node's heartbeat topic: like its report topic only its principal writes it, and
    the preemptor reads it directly (liveness does not wait on the relay)."""
    return f"{prefix}{BEATS}{check_node_name(node)}"


def node_principal(node: str) -> str:
    """The Kafka user a node's agent logs in as."""
    return f"node-agent.{check_node_name(node)}"


def host_report_topic(prefix: str, host: str) -> str:
    """The report topic of a node host: every node it hosts reports there."""
    return f"{prefix}{HOST_REPORTS}{check_node_name(host)}"


def host_beats_topic(prefix: str, host: str) -> str:
    """The beats topic of a node host: one ``HostBeats`` record an interval for all its nodes."""
    return f"{prefix}{HOST_BEATS}{check_node_name(host)}"


def hosted_node_name(host: str, index: int) -> str:
    """The name of a host's ``index``-th node: the host's name is the prefix it owns."""
    return check_node_name(f"{host}-{index:05d}")


def hosted_by(host: str, node: str) -> bool:
    """Whether a host may report and beat for ``node``: only for names ``<host>-...``."""
    return bool(host) and node.startswith(host + "-") and len(node) > len(host) + 1 \
        and _NODE_NAME.fullmatch(node) is not None


def hosted_node(host: str, headers) -> tuple[str, str]:
    """The node a record of ``host``'s report topic speaks for, from its NODE_HEADER, and
    '' -- or '' and why the host may not speak for it."""
    named = next((value for key, value in headers or () if key == NODE_HEADER), b"")
    node = named.decode(errors="replace")
    if hosted_by(host, node):
        return node, ""
    return "", f"names node {node!r} in its {NODE_HEADER} header, which host {host!r} does not host " \
               f"(a host speaks only for nodes named {host}-...)"


def host_principal(host: str) -> str:
    """The Kafka user a node host logs in as (one for all its nodes)."""
    return f"node-host.{check_node_name(host)}"


def report_pattern(prefix: str) -> str:
    """The regular expression of every report topic of a deployment, the node hosts' too
    (the relay subscribes to it)."""
    return "^" + re.escape(prefix) + "(" + re.escape(REPORTS) + "|" + re.escape(HOST_REPORTS) + r")[A-Za-z0-9._-]+$"


def node_of_topic(prefix: str, topic: str, kind: str = REPORTS) -> str:
    """The node a report (or, with ``kind=BEATS``, heartbeat) topic belongs to: the broker
    authenticated its writer. '' for any other topic."""
    head = prefix + kind
    return topic[len(head):] if topic.startswith(head) else ""


def check_usage_node(node: str, record_node: str) -> str:
    """Why a usage record naming ``record_node``, read from ``node``'s report topic, may
    not reach the usage topic; '' when it may."""
    return "" if record_node == node else f"usage record of node {record_node!r} reported by node {node!r}"


def check_report(node: str, pool: str, event: ev.Event, state: ClusterState) -> str:
    """Why ``event``, read from ``node``'s report topic with ``pool`` in its envelope, may
    not enter the pool log whose folded state is ``state`` (the partition of ``pool``);
    '' when it may. Ownership only: whether the event is still current (a stale attempt,
    a health already known) is the reducer's call, as for any event."""
    if not isinstance(event, AGENT_KINDS):
        return f"{type(event).__name__} is not an event a node-agent reports"
    if isinstance(event, ev.NodeRegistered):
        info = event.node
        if info.name != node:
            return f"NodeRegistered of node {info.name!r} on the report topic of node {node!r}"
        if info.pool != pool:
            return f"NodeRegistered of pool {info.pool!r} sent to the log of pool {pool!r}"
        return ""
    registered = state.nodes.get(node)
    if registered is None or registered.info.pool != pool:
        return f"node {node!r} is not registered in pool {pool!r}"
    if isinstance(event, (ev.GpuHealthChanged, ev.NodeCordoned)):
        kind = type(event).__name__
        return "" if event.node == node else f"{kind} of node {event.node!r} reported by node {node!r}"
    return _check_attempt(node, event, state)


def _check_attempt(node: str, event, state: ClusterState) -> str:
    kind = type(event).__name__
    named = getattr(event, "node", node)   # CheckpointSaved, AttemptFailed, ReplicaReadiness name no node
    if named != node:
        return f"{kind} about node {named!r} reported by node {node!r}"
    job = state.jobs.get(event.job_id)
    if job is None:
        return f"{kind} of job {event.job_id!r}, which is not in this pool's log"
    if event.attempt != job.attempt:
        return f"{kind} of attempt {event.attempt} of job {event.job_id!r}, which is at attempt {job.attempt}"
    workers = [w.worker for w in job.workers if w.node == node]
    if isinstance(event, (ev.WorkerStarted, ev.WorkerFinished)):
        ok = event.worker in workers
        what = f"worker {event.worker} of"
    elif isinstance(event, (ev.RendezvousSet, ev.ReplicaReadiness)):   # worker 0's node meets and serves
        ok = 0 in workers
        what = "worker 0 of"
    else:
        ok = bool(workers)
        what = "a worker of"
    return "" if ok else f"{kind}: {what} job {event.job_id!r} attempt {event.attempt} is not placed on node {node!r}"


async def queue_report(publisher, topic: str, event: ev.Event, pool: str, node: str = "") -> asyncio.Future:
    """Queue one event on a node's report topic (keyed and enveloped with its pool, as in
    the pool log); the future it returns resolves once the broker acknowledged it. Reports
    queued one after the other on a topic are appended in that order (one partition, an
    idempotent producer). ``publisher`` is the agent's ``EventPublisher``; ``node``, on a
    node host's topic, names the node it is from."""
    extra = [(NODE_HEADER, node.encode())] if node else None
    return await publisher.send_event_to(topic, event, pool, extra)


Queue = Callable[[ev.Event], Awaitable[asyncio.Future]]
Publish = Callable[[ev.Event], Awaitable[None]]


async def queued(queue: Queue, event: ev.Event) -> asyncio.Future | None:
    """``queue(event)``: the future of its acknowledgement; None when it could not be queued."""
    try:
        return await queue(event)
    except asyncio.CancelledError:
        raise
    except Exception:   # confirm() sends it again, with the publisher's retries
        return None


async def confirm(publish: Publish, event: ev.Event, acked: asyncio.Future | None) -> None:
    """Wait for ``acked``, the acknowledgement of ``event``'s first send; when that send
    failed or never went, ``publish(event)`` (the sender's send with retries)."""
    if acked is not None:
        try:
            await acked
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("%s not acknowledged (%r); sending it again", type(event).__name__, exc)
    await publish(event)


async def report_behind(queue: Queue, publish: Publish, event: ev.Event, first: asyncio.Future | None,
                        confirmed: asyncio.Future) -> None:
    """Report ``event`` after an earlier report of the same worker, whose first send is
    ``first`` and whose ``confirm`` is ``confirmed``. While that first send has not failed,
    ``event`` is queued at once, behind it: a worker's end does not wait for the broker's
    acknowledgement of its start (in a burst of short jobs, a round trip of every GPU
    slot's turnaround). Otherwise it goes once the earlier report is in. (Should the first
    send fail after ``event`` was queued, the earlier report is sent again and lands after
    it, where the reducer finds it stale: a start after the end.)"""
    if first is None or (first.done() and (first.cancelled() or first.exception() is not None)):
        await confirmed
        await publish(event)
        return
    acked = await queued(queue, event)
    await confirmed
    await confirm(publish, event, acked)
