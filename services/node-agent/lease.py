"""The node lease: a small file holding the absolute time (epoch seconds, a float as
text) until which this node may run work.

Contract:

* The agent calls ``NodeLease.renew(sent_at + lease_s)`` each time the broker
  acknowledges a heartbeat the agent sent at ``sent_at``. Counting from the send time,
  not the acknowledgement, keeps the lease on the safe side: the scheduler cannot
  have seen the node alive later than that heartbeat.
* Every worker's shim (``shim.c``) reads the file on its own and fences its workload
  (SIGTERM, then SIGKILL after its kill-wait) once ``time.time()`` passes the expiry,
  so a frozen or dead agent stops renewing and its work ends by itself. A workload
  never outlives ``expiry + kill_wait + poll`` (see ``shim.c``), which is how long
  the scheduler waits after the last acknowledged heartbeat before it places the job
  elsewhere.
* ``revoke()`` expires the lease now, e.g. when the node learns it was declared lost.
* A missing, empty or garbled file reads as expired (``0.0``): a shim never runs
  work on a lease it cannot read.

Shims and agent share one host, hence one clock; the file is replaced atomically, so a
reader sees the old expiry or the new one, never a half-written value. ``read_expiry``
reads the file as the shim does (``read_expiry`` in ``shim.c``).
"""
from __future__ import annotations

import math
import os
import tempfile
import time
from pathlib import Path

EXPIRED = 0.0


def read_expiry(path: str | os.PathLike) -> float:
    """The lease's expiry (epoch seconds); ``0.0`` when the file is missing or garbled."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.read(fd, 64)
        finally:
            os.close(fd)
        value = float(data.decode("ascii"))   # float() ignores the whitespace around
    except (OSError, ValueError, UnicodeDecodeError):
        return EXPIRED
    return value if math.isfinite(value) else EXPIRED


class NodeLease:
    """The writer's side: the agent renews and revokes the lease file at ``path``."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def renew(self, until: float) -> None:
        """Set the expiry to ``until`` (epoch seconds)."""
        if isinstance(until, bool) or not isinstance(until, (int, float)) or not math.isfinite(until):
            raise ValueError(f"lease expiry 'until' must be a finite number of epoch seconds, got {until!r}")
        self._write(float(until))

    def revoke(self) -> None:
        """Expire the lease now: every shim fences its workload at its next look."""
        self._write(time.time())

    def expiry(self) -> float:
        return read_expiry(self.path)

    def _write(self, until: float) -> None:
        # temp file in the same folder + os.replace: readers never see a partial value
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".lease-", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(repr(until))
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
