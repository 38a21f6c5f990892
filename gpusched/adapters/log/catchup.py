"""Parallel catch-up: a partition far behind the log is rebuilt by two processes.

Replaying a pool log costs ~13 us per event in one process: reading the records
(aiokafka, ~1.7 us), decoding the protobuf into domain events (~4 us), the reducer
(~6 us), the loop. Only the reducer must run where the state lives. So when a follower
gets a partition whose lag is large (``FollowerOptions.parallel_replay_min``, see ``gpusched.adapters.log.parallel_catchup``), it starts
this module as a reader process over the records it lacks: the reader fetches them, decodes
each protobuf straight into the event's flat form (``codec.decode_flat``: plain tuples, see
``gpusched.adapters.log.flat``) and writes them to its stdout in frames; the follower loads each
frame (a pickle of tuples: 0.4 us an event), rebuilds the events and folds them, while the reader is already decoding the next frame.
It is a pipeline of two stages on two cores, as databases recover with parallel redo.

Frames: a 4-byte little-endian length, then ``pickle.dumps((offsets, items))``, where
``items[i]`` is the flat event at ``offsets[i]``, or ``(-1, reason, key, value)`` for a
record that did not decode (the follower dead-letters it, as it would have). A zero
length ends the stream; a stream that stops without it is a failed reader, and the
follower goes on from the last offset it folded with its own consumer.

    python -m gpusched.adapters.log.catchup BOOTSTRAP TOPIC PARTITION START END
"""
from __future__ import annotations

import asyncio
import gc
import os
import pickle
import struct
import sys
from typing import AsyncIterator

from gpusched.adapters.broker.kafka_security import KafkaConnection, Where, connection

FRAME_EVENTS = 4096          # events per frame: a fold of ~30 ms between two looks at the loop
_LENGTH = struct.Struct("<I")
_PIPE_BYTES = 1 << 20        # the reader runs a frame ahead of the fold, not stalled by a 64 KiB pipe
_F_SETPIPE_SZ = 1031         # fcntl.F_SETPIPE_SZ (Linux); older Pythons lack the name
READ_IDLE_S = 30.0           # a reader that gets no record for this long gives up


class CatchUpFailed(RuntimeError):
    """The reader stopped before the end of its range."""


Frame = tuple[list[int], list[tuple]]


# --- the follower's side --------------------------------------------------------------
async def frames(bootstrap: Where, topic: str, partition: int, start: int, end: int) -> AsyncIterator[Frame]:
    """Frames of the records of ``topic[partition]`` from offset ``start`` up to ``end``
    (exclusive), decoded by a reader process; the process is killed when the caller
    stops early."""
    conn = connection(bootstrap)
    # The login travels in the reader's environment, not its argv (``ps`` shows argv).
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpusched.adapters.log.catchup", conn.bootstrap, topic, str(partition), str(start),
        str(end), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        env={**os.environ, **conn.env()})
    ended = False
    try:
        while True:
            try:
                (size,) = _LENGTH.unpack(await proc.stdout.readexactly(_LENGTH.size))
                if size == 0:
                    ended = True
                    break
                data = await proc.stdout.readexactly(size)
            except asyncio.IncompleteReadError:
                raise CatchUpFailed(f"reader of {topic}[{partition}] exited with {await proc.wait()} "
                                    "before the end of its range") from None
            yield _load(data)
    finally:
        if not ended and proc.returncode is None:
            proc.kill()
        # Read the pipe to its end first: on Python 3.11 wait() returns only once every
        # pipe of the process has seen EOF, and a pipe paused with unread data (over the
        # stream's limit) never does, so waiting on a killed reader would hang.
        await proc.stdout.read()
        await proc.wait()


def _load(data: bytes) -> Frame:
    """Unpickle a frame with the cyclic GC paused: its ~10,000 tuples would otherwise set
    off a dozen collections, each scanning what the frame built so far; they die by
    reference count once folded (or join the state)."""
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        return pickle.loads(data)
    finally:
        if paused:
            gc.enable()


# --- the reader process ---------------------------------------------------------------
async def read_range(bootstrap: Where, topic: str, partition: int, start: int, end: int, out) -> None:
    """Decode ``topic[partition]`` from ``start`` to ``end`` (exclusive) into frames on
    the binary stream ``out``."""
    from aiokafka import TopicPartition

    from gpusched.adapters.log.codec import DecodeError, NewerLogSchema, decode_flat
    from gpusched.adapters.log.flat import NEWER_SCHEMA, forget_strings
    from gpusched.adapters.broker.topic_reader import TopicReader

    reader = TopicReader(bootstrap, max_partition_fetch_bytes=16 << 20, fetch_max_bytes=64 << 20,
                         isolation_level="read_uncommitted", client_id=f"catchup-{partition}")
    await reader.start()
    try:
        tp = TopicPartition(topic, partition)
        await reader.assign([tp], start)
        offsets: list[int] = []
        items: list[tuple] = []
        position = start
        while position < end:
            batch = (await reader.fetch(tp, timeout_ms=int(READ_IDLE_S * 1000), max_records=FRAME_EVENTS)).get(tp)
            if not batch:
                raise CatchUpFailed(f"no record of {topic}[{partition}] at {position} for {READ_IDLE_S:g} s")
            gc.disable()   # as the follower folds: what a batch builds dies by reference count
            try:
                for record in batch:
                    if record.offset >= end:
                        break
                    try:
                        item = decode_flat(record.value)
                    except DecodeError as exc:
                        item = (-1, str(exc), record.key, record.value)
                    except NewerLogSchema as exc:   # the follower stops on it (fold.fold_flat)
                        item = (NEWER_SCHEMA, exc.schema, exc.producer)
                    offsets.append(record.offset)
                    items.append(item)
                    if len(items) >= FRAME_EVENTS:
                        _write_frame(out, offsets, items)
                        offsets, items = [], []
                        forget_strings()
            finally:
                gc.enable()
            position = max(position, batch[-1].offset + 1)
        if items:
            _write_frame(out, offsets, items)
        out.write(_LENGTH.pack(0))
        out.flush()
    finally:
        await reader.stop()


def _write_frame(out, offsets: list[int], items: list[tuple]) -> None:
    data = pickle.dumps((offsets, items), protocol=5)
    out.write(_LENGTH.pack(len(data)))
    out.write(data)
    out.flush()


def _main(argv: list[str]) -> int:
    if len(argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    bootstrap, topic, partition, start, end = argv[0], argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    out = sys.stdout.buffer
    try:
        import fcntl
        fcntl.fcntl(out.fileno(), _F_SETPIPE_SZ, _PIPE_BYTES)
    except OSError:   # not a pipe, or a smaller system limit: frames still flow, in smaller steps
        pass
    gc.freeze()   # what the imports built: collections scan only what the reading makes
    conn = KafkaConnection.from_env(bootstrap=bootstrap)   # set by ``frames``
    asyncio.run(read_range(conn, topic, partition, start, end, out))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
