"""Times between the domain (float seconds, as the log records them) and the API
(``google.protobuf.Timestamp`` for instants, ``Duration`` for spans).

The domain keeps ``0.0`` for "not yet" (a job not placed) and for "none" (no time
limit); the API leaves such a Timestamp unset and shows such a span as a zero Duration."""
from __future__ import annotations

from google.protobuf import duration_pb2, timestamp_pb2

from gpusched.core.validation import FieldError

# google.protobuf.Duration's own range (duration.proto): about 10,000 years.
MAX_DURATION_S = 315_576_000_000
_NANOS = 1_000_000_000


def set_instant(field: timestamp_pb2.Timestamp, seconds: float) -> None:
    """Fill ``field`` with epoch ``seconds``; 0 (not yet) leaves it unset."""
    if seconds:
        field.FromNanoseconds(round(seconds * _NANOS))


def duration(seconds: float) -> duration_pb2.Duration:
    span = duration_pb2.Duration()
    span.FromNanoseconds(round(seconds * _NANOS))
    return span


def span_seconds(span: duration_pb2.Duration, field: str) -> float | FieldError:
    """A request's span in seconds, or the error naming ``field``: negative, or not a
    valid Duration (seconds beyond its range, nanos beyond a second or of the other sign)."""
    seconds, nanos = span.seconds, span.nanos
    if abs(seconds) > MAX_DURATION_S or abs(nanos) >= _NANOS or (seconds and nanos and (seconds > 0) != (nanos > 0)):
        return FieldError(field, f"not a valid google.protobuf.Duration (seconds={seconds}, nanos={nanos})")
    if seconds < 0 or nanos < 0:
        return FieldError(field, f"must not be negative (got {seconds + nanos / _NANOS:g}s)")
    return seconds + nanos / _NANOS
