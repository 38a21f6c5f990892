"""``gpusched billing`` and ``gpusched audit``: reports queried from the consumers' database
(``gpusched.consumers.store``), by team, pool and time range; the consumers
(``gpusched billing-consumer`` / ``audit-consumer``) keep it up to date."""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import defaultdict
from datetime import datetime, timezone

from gpusched.consumers.records import GROUPS, MS_PER_GPU_HOUR, allocated_hours, day_of
from gpusched.config import AccountingSettings, KafkaSettings, SettingsError
from gpusched.consumers.store import Store, StoreError


def parse_time(text: str) -> float:
    """Epoch seconds, or an ISO date / date-time (UTC unless it names its zone)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither epoch seconds nor an ISO date/time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    AccountingSettings.add_args(parser)
    KafkaSettings.add_args(parser, only=("topic_prefix",))   # the cluster to report on
    parser.add_argument("--team", default="")
    parser.add_argument("--pool", default="")
    parser.add_argument("--since", type=parse_time, default=-math.inf, help="epoch seconds or ISO date/time (UTC)")
    parser.add_argument("--until", type=parse_time, default=math.inf, help="epoch seconds or ISO date/time (UTC)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The flags, with ``db`` and ``topic_prefix`` from the settings (flag, else variable,
    else default); a bad one is a usage error naming it."""
    args = parser.parse_args(argv)
    try:
        args.db = AccountingSettings.from_args(args).db
        args.topic_prefix = KafkaSettings.from_args(args).topic_prefix
    except SettingsError as exc:
        parser.error(str(exc))
    return args


def _open_store(args, consumer: str) -> Store:
    """The store, checked to hold what the consumer wrote for this prefix."""
    store = Store(args.db, create=False)
    clusters = store.clusters()
    if args.topic_prefix not in clusters:
        raise StoreError(f"database {store.safe_url} holds nothing for topic prefix {args.topic_prefix!r} "
                         f"(it holds: {', '.join(map(repr, clusters)) or 'nothing'}); "
                         f"is `gpusched {consumer}-consumer --topic-prefix {args.topic_prefix}` running against it?")
    if not store.progress(args.topic_prefix, consumer):
        raise StoreError(f"database {store.safe_url}: no {consumer} consumer ran for {args.topic_prefix!r} "
                         f"(start `gpusched {consumer}-consumer`)")
    return store


def _fail(prog: str, exc: Exception) -> int:
    print(f"{prog}: {exc}", file=sys.stderr)
    return 1


# --- billing ---------------------------------------------------------------------------
def billing_report(store: Store, cluster: str, by: tuple[str, ...], team: str = "", pool: str = "",
                   since: float = -math.inf, until: float = math.inf, now: float | None = None) -> dict:
    """{group key: {"allocated": GPU-hours, "used": GPU-hours measured busy, "measured": ...}}."""
    spans = store.spans(cluster, team=team, pool=pool, since=since, until=until)
    allocated = allocated_hours(spans, by, since, until, now)
    team_of = {s.job_id: s.team for s in store.spans(cluster)}
    used: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for job_id, record_pool, t, used_ms, measured_ms in store.used(cluster, pool=pool, since=since, until=until):
        job_team = team_of.get(job_id, "")
        if team and job_team != team:
            continue
        fields = {"team": job_team, "pool": record_pool, "job": job_id, "day": day_of(t)}
        key = tuple(fields[k] for k in by)
        used[key][0] += used_ms / MS_PER_GPU_HOUR
        used[key][1] += measured_ms / MS_PER_GPU_HOUR
    keys = sorted(set(allocated) | set(used))
    return {key: {"allocated": allocated.get(key, 0.0), "used": used[key][0] if key in used else 0.0,
                  "measured": used[key][1] if key in used else 0.0} for key in keys}


def _print_billing(report: dict, by: tuple[str, ...], header: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"by": list(by), "rows": [{**dict(zip(by, key)), **values}
                                                   for key, values in report.items()]}))
        return
    print(header)
    if not report:
        print("  (no GPU time in this range)")
        return
    width = max(12, *(len(" / ".join(key)) for key in report))
    print(f"  {' / '.join(by):<{width}} {'allocated':>12} {'used':>12} {'measured':>12}   (GPU-hours)")
    for key, v in report.items():
        print(f"  {' / '.join(key):<{width}} {v['allocated']:12.4f} {v['used']:12.4f} {v['measured']:12.4f}")


def billing_main(argv: list[str] | None = None) -> int:
    """``gpusched billing``: GPU-hours allocated and used, per team (or pool, job, day)."""
    parser = _parser("gpusched billing", billing_main.__doc__)
    parser.add_argument("--by", nargs="+", choices=GROUPS, default=["team"], help="group by these (in order)")
    parser.add_argument("--follow", type=float, default=0.0, help="report again every N seconds (N > 0)")
    args = _parse(parser, argv)
    if args.follow < 0 or not math.isfinite(args.follow):
        parser.error(f"--follow: {args.follow} is not a period in seconds > 0")
    by = tuple(args.by)
    try:
        store = _open_store(args, "billing")
        while True:
            now = time.time()
            report = billing_report(store, args.topic_prefix, by, args.team, args.pool, args.since, args.until, now)
            _print_billing(report, by, _header(store, args.topic_prefix, "billing", now), args.json)
            if not args.follow:
                return 0
            time.sleep(args.follow)   # the report period the user asked for
    except StoreError as exc:
        return _fail("gpusched billing", exc)
    except KeyboardInterrupt:
        return 0


def _header(store: Store, cluster: str, consumer: str, now: float) -> str:
    done = store.progress(cluster, consumer)
    records = sum(offset + 1 for offset, _ in done.values())
    return (f"GPU-hours of {cluster!r} at {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(now))} UTC "
            f"(open allocations up to now; {records} records stored from {len(done)} partitions):")


# --- audit -----------------------------------------------------------------------------
def audit_main(argv: list[str] | None = None) -> int:
    """``gpusched audit``: who did what (submissions, cancellations, policy, nodes, preemptions)."""
    parser = _parser("gpusched audit", audit_main.__doc__)
    parser.add_argument("--principal", default="", help="only what this principal asked")
    parser.add_argument("--action", default="", help="only this event type, e.g. JobCancelled")
    parser.add_argument("--limit", type=int, default=0, help="at most this many rows (0: all)")
    args = _parse(parser, argv)
    if args.limit < 0:
        parser.error(f"--limit: {args.limit} is negative")
    try:
        store = _open_store(args, "audit")
        rows = store.audit(args.topic_prefix, team=args.team, pool=args.pool, principal=args.principal,
                           action=args.action, since=args.since, until=args.until, limit=args.limit)
    except StoreError as exc:
        return _fail("gpusched audit", exc)
    if args.json:
        print(json.dumps([{k: v for k, v in row._mapping.items() if k != "cluster"} for row in rows]))
        return 0
    if not rows:
        print("no audit records match")
        return 0
    print(f"{'time (UTC)':<19} {'action':<18} {'who':<24} {'subject':<28} {'team':<14} ok  detail")
    for r in rows:
        who = r.principal or f"({r.producer})"
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r.time))
        print(f"{stamp:<19} {r.action:<18} {who:<24} {r.subject:<28} {r.team:<14} "
              f"{'yes' if r.accepted else 'no ':<3} {r.detail}")
    return 0
