"""``gpusched policy``: read and set the cluster policy through admission's ClusterService
(docs/policy.md). Prints the policy the log holds after the call, as JSON."""
from __future__ import annotations

import argparse
import asyncio
import json
import sys

import grpc
from google.protobuf.json_format import MessageToDict

from gpusched.config import process_settings
from gpusched.v1 import cluster_pb2, cluster_pb2_grpc


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpusched policy", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default=process_settings().admission,
                   help="admission's address (env GPUSCHED_ADMISSION)")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("get", help="the quotas and team policies the log holds")
    q = sub.add_parser("set-quota", help="an org's quota (no --team) or a team's ('*': the default)")
    q.add_argument("--org", default="")
    q.add_argument("--team", default="")
    q.add_argument("--guaranteed", type=float, default=0.0, help="GPUs")
    q.add_argument("--limit", type=float, help="GPUs (unset: none)")
    q.add_argument("--no-borrowing", action="store_true", help="never above the guarantee")
    q.add_argument("--lending-limit", type=float, help="GPUs of the unused guarantee others may borrow")
    q.add_argument("--weight", type=float, help="an org's fair-share weight")
    t = sub.add_parser("set-team", help="a team's weight and allow-lists ('*': the default)")
    t.add_argument("team")
    t.add_argument("--weight", type=float)
    t.add_argument("--priority-class", action="append", default=[], help="repeat; none: every class")
    t.add_argument("--pool", action="append", default=[], help="repeat; none: every pool")
    return p


def _request(args: argparse.Namespace):
    if args.command == "set-quota":
        req = cluster_pb2.SetQuotaRequest(org=args.org, team=args.team, guaranteed_gpus=args.guaranteed)
        for name, value in (("limit_gpus", args.limit), ("lending_limit_gpus", args.lending_limit),
                            ("weight", args.weight)):
            if value is not None:
                setattr(req, name, value)
        if args.no_borrowing:
            req.borrowing = False
        return "SetQuota", req
    if args.command == "set-team":
        req = cluster_pb2.SetTeamPolicyRequest(team=args.team, priority_classes=args.priority_class,
                                               pools=args.pool)
        if args.weight is not None:
            req.weight = args.weight
        return "SetTeamPolicy", req
    return "GetPolicy", cluster_pb2.GetPolicyRequest()


async def _call(args: argparse.Namespace) -> int:
    method, request = _request(args)
    async with grpc.aio.insecure_channel(args.target) as channel:
        try:
            view = await getattr(cluster_pb2_grpc.ClusterServiceStub(channel), method)(request)
        except grpc.aio.AioRpcError as exc:
            print(f"{exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
    print(json.dumps(MessageToDict(view, preserving_proto_field_name=True), indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(_call(build_parser().parse_args(argv)))
