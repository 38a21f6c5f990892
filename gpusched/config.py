"""Service configuration, validated with pydantic: flags and environment in, typed settings out."""
from __future__ import annotations

import argparse
import logging
import os

from pydantic import BaseModel, Field

from gpusched.adapters.kafka_admin import TopicNames


# A finished job stays queryable this long after it ended (log time), then it leaves the
# state (gpusched.core.retention); its history stays in the log. Admission records its
# ``--job-retention`` (this by default) in each partition's log as a JobRetentionSet.
DEFAULT_JOB_RETENTION_S = 3600.0


class KafkaSettings(BaseModel):
    """Where the log is: all services of a cluster share these."""

    bootstrap: str = Field(min_length=3)
    topic_prefix: str = "gpusched."
    partitions: int = Field(default=4, ge=1, le=1024)

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
    parser.add_argument("--log-level", default=os.environ.get("GPUSCHED_LOG_LEVEL", "INFO"))


def kafka_settings(args: argparse.Namespace) -> KafkaSettings:
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from gpusched.adapters.eventlog import parallel_replay_min_from_env

    try:
        parallel_replay_min_from_env()   # read by every LogFollower: fail here, with its name
        return KafkaSettings(bootstrap=args.bootstrap, topic_prefix=args.topic_prefix, partitions=args.partitions)
    except ValueError as exc:
        raise SystemExit(f"invalid settings: {exc}")


def retention_seconds(text: str) -> float:
    """argparse ``type`` of ``--job-retention``: seconds, finite and >= 0."""
    value = float(text)
    if not 0.0 <= value < float("inf"):
        raise ValueError(text)
    return value

