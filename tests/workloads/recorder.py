"""A test workload that records what it does, for checks that no two attempts ever ran
on one GPU at once (``intervals.py`` reads the records).

    python tests/workloads/recorder.py [--duration S] [--tick S] [--checkpoint-every S]
                                       [--ignore-term] [--exit CODE]

Appends JSON lines to ``$GPUSCHED_RECORD`` (default ``<cwd>/record.jsonl``), one
``write`` each, so several workloads may share a file. Every record has ``event``,
``t`` (epoch seconds) and ``pid``:

* ``{"event": "start", "gpus", "job", "attempt", "worker", "resumed_from"}``
  with ``gpus`` = ``$CUDA_VISIBLE_DEVICES`` and the ids the agent sets
  (``GPUSCHED_JOB_ID``, ``GPUSCHED_ATTEMPT``, ``GPUSCHED_WORKER``);
* ``{"event": "tick", "progress"}`` every ``--tick`` seconds;
* ``{"event": "term", "ignored"}`` when SIGTERM arrives;
* ``{"event": "end", "how"}`` (``done``, ``failed`` or ``term``) on a normal exit or
  on SIGTERM. A SIGKILLed workload records no end: its last tick is the last sign of life.

Work: ``--duration`` seconds in all, resuming from ``$GPUSCHED_RESUME_FROM`` (a checkpoint
location it wrote itself, ``...@<progress>``). With ``--checkpoint-every`` it writes
"<location> <progress_s>" to ``$GPUSCHED_CHECKPOINT_FILE`` (the node-agent's protocol),
and once more when SIGTERM stops it. ``--ignore-term`` keeps running through SIGTERM (to
test the kill deadline); ``--exit CODE`` ends with CODE after the duration.
Exit codes: 0 (or ``--exit``) when done, 143 on SIGTERM.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

EXIT_TERMINATED = 128 + signal.SIGTERM


class Recorder:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, event: str, **fields) -> None:
        line = json.dumps({"event": event, "t": time.time(), "pid": os.getpid(), **fields}) + "\n"
        os.write(self.fd, line.encode())   # one write per line: O_APPEND keeps lines whole


def _int_env(name: str) -> int | None:
    text = os.environ.get(name, "")
    return int(text) if text.isdigit() else None


def resumed_from() -> float:
    location = os.environ.get("GPUSCHED_RESUME_FROM", "")
    try:
        return float(location.rsplit("@", 1)[1]) if "@" in location else 0.0
    except ValueError:
        raise SystemExit(f"recorder: GPUSCHED_RESUME_FROM {location!r} is not a checkpoint of this workload")


def checkpoint(progress: float) -> None:
    path = os.environ.get("GPUSCHED_CHECKPOINT_FILE")
    if not path:
        return
    job, attempt, worker = (os.environ.get(k, "") for k in ("GPUSCHED_JOB_ID", "GPUSCHED_ATTEMPT", "GPUSCHED_WORKER"))
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:   # replaced whole: the agent never reads half a line
        f.write(f"record://{job}/{attempt}/{worker}@{progress:.3f} {progress:.3f}")
    os.replace(tmp, path)


def run(args: argparse.Namespace, rec: Recorder) -> int:
    terms = []
    signal.signal(signal.SIGTERM, lambda *_: terms.append(time.time()))
    done = min(resumed_from(), args.duration)
    rec.write("start", gpus=os.environ.get("CUDA_VISIBLE_DEVICES", ""),
              job=os.environ.get("GPUSCHED_JOB_ID"), attempt=_int_env("GPUSCHED_ATTEMPT"),
              worker=_int_env("GPUSCHED_WORKER"), resumed_from=done)
    t0, saved = time.monotonic(), done
    while True:
        progress = min(args.duration, done + time.monotonic() - t0)
        while terms:
            terms.pop()
            rec.write("term", ignored=args.ignore_term)
            if not args.ignore_term:
                if args.checkpoint_every > 0:
                    checkpoint(progress)
                rec.write("end", how="term")
                return EXIT_TERMINATED
        if progress >= args.duration:
            if args.checkpoint_every > 0:
                checkpoint(progress)
            rec.write("end", how="failed" if args.exit else "done")
            return args.exit
        rec.write("tick", progress=round(progress, 4))
        if args.checkpoint_every > 0 and progress - saved >= args.checkpoint_every:
            checkpoint(progress)
            saved = progress
        time.sleep(min(args.tick, args.duration - progress))


def _seconds(field: str):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{field} must be a number of seconds, got {text!r}")
        if value < 0:
            raise argparse.ArgumentTypeError(f"{field} must be >= 0, got {text!r}")
        return value
    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=_seconds("--duration"), default=float("inf"))
    parser.add_argument("--tick", type=_seconds("--tick"), default=0.05)
    parser.add_argument("--checkpoint-every", type=_seconds("--checkpoint-every"), default=0.0)
    parser.add_argument("--ignore-term", action="store_true")
    parser.add_argument("--exit", type=int, default=0, help="exit code after the duration")
    args = parser.parse_args(argv)
    if args.tick <= 0:
        parser.error(f"--tick must be > 0, got {args.tick}")
    rec = Recorder(os.environ.get("GPUSCHED_RECORD") or os.path.join(os.getcwd(), "record.jsonl"))
    return run(args, rec)


if __name__ == "__main__":
    sys.exit(main())
