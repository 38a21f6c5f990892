"""What every service process does around its own logic: Kafka plumbing, a gRPC server
with health, and a clean stop on SIGTERM/SIGINT."""
from __future__ import annotations

import asyncio
import logging
import signal
import uuid

from gpusched.adapters.broker.broker_watch import watch_broker
from gpusched.adapters.log.dead_letters import LetterIndex
from gpusched.adapters.log.publisher import DeadLetters, EventPublisher
from gpusched.adapters.log.gc_pacing import pace_gc
from gpusched.adapters.broker.kafka_admin import TopicNames, ensure_topics, wait_for_broker
from gpusched.adapters.broker.kafka_security import KafkaConnection, KafkaLoginRefused
from gpusched.config import KafkaSettings

log = logging.getLogger("gpusched.service")


def instance_id(service: str) -> str:
    return f"{service}-{uuid.uuid4().hex[:8]}"


async def connect(settings: KafkaSettings, instance: str,
                  pool_log_letters: bool = False) -> tuple[EventPublisher, DeadLetters]:
    """``pool_log_letters``: this service writes the pool log's dead letters (the placer);
    the others only log the records they skip."""
    pace_gc()   # a service lives long and its state grows: see gc_pacing
    conn, topics = KafkaConnection.from_settings(settings), TopicNames(settings.topic_prefix)
    await _wait_for_broker(conn, settings.broker_wait, instance)
    watch_broker(conn.bootstrap)   # a broker lost later: one warning, not the client's errors
    try:
        await ensure_topics(conn, topics, settings.partitions,
                            replication_factor=settings.replication_factor,
                            min_insync_replicas=settings.min_insync_replicas)
    except PermissionError as exc:   # topics missing on a secured cluster
        raise SystemExit(f"{instance}: {exc}") from None
    publisher = EventPublisher(conn, topics, settings.partitions)
    await publisher.start()
    index = LetterIndex(conn, topics.dead_letters) if pool_log_letters else None
    return publisher, DeadLetters(publisher, instance, index)


async def _wait_for_broker(conn: KafkaConnection, seconds: float, instance: str) -> None:
    """One line while waiting and one reason when giving up, instead of the Kafka client's
    connection error every half second and then a traceback."""
    client_log = logging.getLogger("aiokafka")
    level = client_log.level
    client_log.setLevel(logging.CRITICAL)
    log.info("%s: waiting up to %gs for the Kafka broker at %s", instance, seconds, conn)
    try:
        await wait_for_broker(conn, seconds)
    except KafkaLoginRefused as exc:   # wrong credentials: a one-line reason, no traceback
        raise SystemExit(f"{instance}: {exc}") from None
    except TimeoutError:
        raise SystemExit(f"{instance}: no Kafka broker answered at {conn} within {seconds:g}s; check --bootstrap "
                         f"(env KAFKA_BOOTSTRAP_SERVERS) and that the broker runs (--broker-wait waits longer)"
                         ) from None
    finally:
        client_log.setLevel(level)


_stop: asyncio.Event | None = None   # the service's, once stop_event() made it
failure = ""   # why the service stopped itself (stop_failing): the process then exits with code 1


def stop_event() -> asyncio.Event:
    global _stop
    stop = _stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def stop_failing(why: str) -> bool:
    """Stop this service the clean way, as SIGTERM does, and have its process exit with
    code 1 after printing ``why`` as its last line (gpusched.commands.run); False when no
    service's stop event runs in this process (the caller raises then)."""
    global failure
    if _stop is None:
        return False
    failure = why
    log.critical("%s; stopping", why)
    _stop.set()
    return True


async def every(interval: float, stop: asyncio.Event, action) -> None:
    """Await ``action()`` now and then every ``interval`` seconds until ``stop`` is set
    (a tick is not skipped when one runs long: the wait starts after it)."""
    while not stop.is_set():
        await action()
        try:
            await asyncio.wait_for(stop.wait(), interval)
        except asyncio.TimeoutError:
            pass
