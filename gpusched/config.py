"""Service configuration, validated with pydantic: flags and environment in, typed settings out."""
from __future__ import annotations

import argparse
import logging
import os

from pydantic import BaseModel, Field

from gpusched.adapters.kafka_admin import TopicNames


# A finished job stays queryable this long after it ended (log time), then it leaves the
# state (gpusched.core.retention); its history stays in the log.
DEFAULT_JOB_RETENTION_S = 3600.0


class KafkaSettings(BaseModel):
    """Where the log is and how every service folds it: all services of a cluster share these."""

    bootstrap: str = Field(min_length=3)
    topic_prefix: str = "gpusched."
    partitions: int = Field(default=4, ge=1, le=1024)
    job_retention_s: float = Field(default=DEFAULT_JOB_RETENTION_S, ge=0)

    @property
    def topics(self) -> TopicNames:
        return TopicNames(self.topic_prefix)


def add_kafka_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092"),
                        help="Kafka bootstrap servers (env KAFKA_BOOTSTRAP_SERVERS)")
    parser.add_argument("--topic-prefix", default=os.environ.get("GPUSCHED_TOPIC_PREFIX", "gpusched."))
    # String defaults from the environment go through ``type`` like a flag would, so a bad
    # value is argparse's clear error ("invalid float value"), not a traceback.
    parser.add_argument("--partitions", type=int, default=os.environ.get("GPUSCHED_PARTITIONS", "4"),
                        help="partitions of the cluster-events topic (pools hash onto them)")
    parser.add_argument("--job-retention", type=float,
                        default=os.environ.get("GPUSCHED_JOB_RETENTION_S", str(DEFAULT_JOB_RETENTION_S)),
                        help="seconds (log time) a finished job stays in the state before it is pruned; 0 keeps "
                             "every job. The same for every service of the cluster (env GPUSCHED_JOB_RETENTION_S)")
    parser.add_argument("--log-level", default=os.environ.get("GPUSCHED_LOG_LEVEL", "INFO"))


def kafka_settings(args: argparse.Namespace) -> KafkaSettings:
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return KafkaSettings(bootstrap=args.bootstrap, topic_prefix=args.topic_prefix, partitions=args.partitions,
                             job_retention_s=args.job_retention)
    except ValueError as exc:
        raise SystemExit(f"invalid settings: {exc}")


def load_quotas(path: str):
    """The org/team quota tree from a JSON file (``QueueTree.from_dict`` format); an
    empty path means no guarantees (every team borrows)."""
    from pathlib import Path

    from gpusched.policies.quota import QueueTree

    if not path:
        return QueueTree()
    try:
        return QueueTree.from_json(Path(path).read_text())
    except (OSError, ValueError, TypeError) as exc:
        raise SystemExit(f"--quotas {path}: {exc}")
