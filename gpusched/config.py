"""Every setting of gpusched, declared once: its name, type, default, limits, and where it
comes from (a flag of the services and its environment variable, or the environment only).

Each model below is validated when a process starts; a bad value stops it with one line
naming the flag and the variable (``SettingsError``). Flags and variables keep the names
they always had; docs/reference/configuration.md lists them all, and tests/unit/test_config.py checks
that list against these models.

This module imports nothing of gpusched, so every layer may read it (docs/design/architecture.md).
"""
from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any, Literal, Mapping, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

# A finished job stays queryable this long after it ended (log time), then it leaves the
# state (gpusched.core.retention); its history stays in the log. Admission records its
# ``--job-retention`` (this by default) in each partition's log as a JobRetentionSet.
DEFAULT_JOB_RETENTION_S = 3600.0
# A partition this many records behind is rebuilt by a reader process and the follower
# in parallel (gpusched.adapters.log.parallel_catchup); below it, starting the reader (~0.3 s)
# costs more than it saves.
PARALLEL_REPLAY_MIN = 100_000
# The placer's placement policy unless --placement names another; the simulator's ``defaults``
# configuration reads it too. best-fit, not fgd-lookahead (which packs best on the openb lists):
# fgd-lookahead's cycle costs about twice as much and it waits longer for whole-GPU and gang
# jobs on the synthetic workload (docs/design/scheduling-placement.md, "Not done / limits").
DEFAULT_PLACEMENT = "best-fit"

# The environment a service (or the catch-up reader process) reads its Kafka connection from.
ENV_BOOTSTRAP = "KAFKA_BOOTSTRAP_SERVERS"
ENV_PROTOCOL = "GPUSCHED_KAFKA_SECURITY_PROTOCOL"
ENV_MECHANISM = "GPUSCHED_KAFKA_SASL_MECHANISM"
ENV_USER = "GPUSCHED_KAFKA_USER"
ENV_PASSWORD = "GPUSCHED_KAFKA_PASSWORD"
ENV_PASSWORD_FILE = "GPUSCHED_KAFKA_PASSWORD_FILE"
ENV_CA = "GPUSCHED_KAFKA_CA"


class SettingsError(ValueError):
    """A setting with a value that cannot work; the message names its flag and variable."""


def setting(default: Any, *, env: str = "", flag: str = "", help: str = "", **limits: Any) -> Any:
    """A field with where it comes from: ``flag`` (services' command line) and ``env``
    (the flag's default, or the only source when there is no flag)."""
    return Field(default=default, description=help, json_schema_extra={"env": env, "flag": flag}, **limits)


class Settings(BaseModel):
    """Settings read from flags (with their variables as defaults) or the environment."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @classmethod
    def sources(cls) -> dict[str, tuple[str, str]]:
        """Field -> (flag, env) for every field."""
        return {name: _flag_and_env(f.json_schema_extra) for name, f in cls.model_fields.items()}

    @classmethod
    def add_args(cls, parser: argparse.ArgumentParser, env: Mapping[str, str] = os.environ,
                 title: str | None = None, only: tuple[str, ...] = ()) -> None:
        """A flag for each field that has one (of ``only``, when given); its default is the
        variable's value, else the field's default. A tuple field's flag may be repeated.
        Values stay text here: ``from_args`` validates them."""
        group = parser.add_argument_group(title) if title else parser
        for name, (flag, var) in cls.sources().items():
            if not flag or (only and name not in only):
                continue
            field = cls.model_fields[name]
            help_text = (field.description or "") + (f" (env {var})" if var else "")
            if field.annotation in (bool, "bool") and field.default is True:   # on unless --no-<flag>
                group.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction,
                                   default=env.get(var, "1") == "1", help=help_text)
            elif field.annotation in (bool, "bool"):
                group.add_argument(flag, dest=name, action="store_true", default=env.get(var, "") == "1",
                                   help=help_text)
            elif get_origin(field.annotation) is tuple:   # no variable: a list has no one spelling
                group.add_argument(flag, dest=name, action="append", default=None, help=help_text)
            elif get_origin(field.annotation) is dict:   # a repeated KEY=VALUE flag
                group.add_argument(flag, dest=name, action="append", metavar="KEY=VALUE", default=None,
                                   help=help_text + "; repeat for each")
            else:
                group.add_argument(flag, dest=name, default=env.get(var, None) if var else None,
                                   help=help_text + f"; default {field.default!r}")

    @classmethod
    def from_args(cls, args: argparse.Namespace, env: Mapping[str, str] = os.environ):
        """The settings from parsed flags (``add_args``); fields without a flag come from
        their variable. Raises ``SettingsError``."""
        values: dict[str, Any] = {}
        for name, (flag, var) in cls.sources().items():
            value = getattr(args, name, None) if flag else env.get(var) if var else None
            if value is not None:
                values[name] = value
        return cls.validated(values)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ):
        """The settings from the environment alone (each field's variable)."""
        return cls.validated({name: env[var] for name, (_, var) in cls.sources().items() if var and var in env})

    @classmethod
    def error(cls, name: str, message: str) -> SettingsError:
        """An error about field ``name`` found after validation (e.g. a name unknown to a
        registry this module cannot import), worded as ``validated``'s."""
        return SettingsError(f"{_where(cls, name)}: {message}")

    @classmethod
    def validated(cls, values: dict[str, Any]):
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise SettingsError("; ".join(_describe(cls, error) for error in exc.errors())) from None


def _flag_and_env(extra: Any) -> tuple[str, str]:
    return (str(extra["flag"]), str(extra["env"])) if isinstance(extra, dict) else ("", "")


def _where(cls: type[Settings], name: str) -> str:
    """Where field ``name`` comes from, as an error names it: ``--flag / env VAR``."""
    flag, var = cls.sources().get(name, ("", ""))
    return " / ".join(w for w in (flag, f"env {var}" if var else "") if w) or name


def _describe(cls: type[Settings], error: Any) -> str:
    name = str(error["loc"][0]) if error["loc"] else ""
    where = _where(cls, name)
    given = f" (got {error['input']!r})" if name and not isinstance(error.get("input"), dict) else ""
    return f"{where}: {error['msg']}{given}"


def _upper(value: Any) -> Any:
    return value.upper() if isinstance(value, str) else value


class KafkaSettings(Settings):
    """Where the log is and how a service reads it: all services of a cluster share these."""

    bootstrap: str = setting("127.0.0.1:19092", flag="--bootstrap", env=ENV_BOOTSTRAP,
                             help="Kafka bootstrap servers", min_length=3)
    topic_prefix: str = setting("gpusched.", flag="--topic-prefix", env="GPUSCHED_TOPIC_PREFIX",
                                help="prefix of every topic name of this deployment")
    partitions: int = setting(4, flag="--partitions", env="GPUSCHED_PARTITIONS",
                              help="partitions of the cluster-events topic (pools hash onto them)", ge=1, le=1024)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = setting(
        "INFO", flag="--log-level", env="GPUSCHED_LOG_LEVEL", help="log level")
    # Security (docs/reference/kafka-security.md): PLAINTEXT, or SASL_SSL with this service's own
    # SCRAM principal and the CA of the brokers' certificates.
    security_protocol: Literal["PLAINTEXT", "SASL_SSL"] = setting(
        "PLAINTEXT", flag="--kafka-security-protocol", env=ENV_PROTOCOL, help="PLAINTEXT or SASL_SSL")
    sasl_mechanism: Literal["SCRAM-SHA-512", "SCRAM-SHA-256"] = setting(
        "SCRAM-SHA-512", flag="--kafka-sasl-mechanism", env=ENV_MECHANISM, help="SCRAM-SHA-512 or SCRAM-SHA-256")
    username: str = setting("", flag="--kafka-user", env=ENV_USER, help="SCRAM user")
    # The password itself only from the environment or a file: a flag would show in ``ps``.
    password: str = Field(default="", repr=False, description="SCRAM password",
                          json_schema_extra={"env": ENV_PASSWORD, "flag": ""})
    password_file: str = setting("", flag="--kafka-password-file", env=ENV_PASSWORD_FILE,
                                 help=f"file holding the SCRAM password (or env {ENV_PASSWORD})")
    ca_file: str = setting("", flag="--kafka-ca", env=ENV_CA, help="CA of the brokers' certificates (PEM)")
    # Topics this service creates: 0 follows the cluster (3+ brokers: 3 copies and 2 in
    # sync; fewer: one each). Existing topics below these are reported at start.
    replication_factor: int = setting(0, flag="--replication-factor", env="GPUSCHED_REPLICATION_FACTOR",
                                      help="copies of each topic created (0: 3 on a cluster of 3+ brokers, else 1)",
                                      ge=0, le=16)
    min_insync_replicas: int = setting(0, flag="--min-insync-replicas", env="GPUSCHED_MIN_INSYNC_REPLICAS",
                                       help="min.insync.replicas of the topics (0: replication factor - 1, "
                                            "at least 1)", ge=0, le=16)
    parallel_replay_min: int = setting(PARALLEL_REPLAY_MIN, flag="--parallel-replay-min",
                                       env="GPUSCHED_PARALLEL_REPLAY_MIN",
                                       help="records behind from which a partition is caught up by a reader "
                                            "process in parallel (0: never)", ge=0)
    broker_wait: float = setting(120.0, flag="--broker-wait", env="GPUSCHED_BROKER_WAIT_S",
                                 help="seconds a service waits at start for the broker to answer before it "
                                      "stops with the reason", gt=0, allow_inf_nan=False)

    _upper_names = field_validator("security_protocol", "sasl_mechanism", "log_level", mode="before")(_upper)

    @model_validator(mode="after")
    def _login(self) -> "KafkaSettings":
        if self.security_protocol == "SASL_SSL" and not (self.username and self.password and self.ca_file):
            raise ValueError("kafka SASL_SSL needs a user, a password and a CA file "
                             f"({ENV_USER}, {ENV_PASSWORD} or {ENV_PASSWORD_FILE}, {ENV_CA})")
        return self

    @model_validator(mode="before")
    @classmethod
    def _password_from_file(cls, values: Any) -> Any:
        if isinstance(values, dict) and not values.get("password") and values.get("password_file"):
            values = {**values, "password": read_password("", values["password_file"])}
        return values


def read_password(password: str, password_file: str) -> str:
    """The password itself, else the first line of the file (a secret mounted as a file
    keeps it out of ``/proc/<pid>/environ``)."""
    if password or not password_file:
        return password
    try:
        return Path(password_file).read_text().splitlines()[0].strip()
    except (OSError, IndexError) as exc:
        raise ValueError(f"kafka password file {password_file}: {exc}") from None


class SecuritySettings(Settings):
    """The gRPC server's TLS, identity and policy, the same for every service (docs/reference/security.md)."""

    insecure: bool = setting(False, flag="--insecure", env="GPUSCHED_INSECURE",
                             help="development only: plaintext gRPC, no authentication, every call allowed; "
                                  "refused on a non-loopback --listen (=1)")
    tls_cert: str = setting("", flag="--tls-cert", env="GPUSCHED_TLS_CERT", help="server certificate (PEM)")
    tls_key: str = setting("", flag="--tls-key", env="GPUSCHED_TLS_KEY", help="server private key (PEM)")
    tls_client_ca: str = setting("", flag="--tls-client-ca", env="GPUSCHED_TLS_CLIENT_CA",
                                 help="CA bundle (PEM): clients must present a certificate it signed (mutual "
                                      "TLS); the certificate's SAN (else its CN) is the principal")
    token_file: str = setting("", flag="--token-file", env="GPUSCHED_TOKEN_FILE",
                              help="static bearer tokens, one 'token,principal' per line")
    jwks_file: str = setting("", flag="--jwks-file", env="GPUSCHED_JWKS_FILE",
                             help="JWKS (JSON) whose keys sign bearer JWTs (RS256/ES256)")
    jwt_issuer: str = setting("", flag="--jwt-issuer", env="GPUSCHED_JWT_ISSUER", help="required 'iss' of JWTs")
    jwt_audience: str = setting("", flag="--jwt-audience", env="GPUSCHED_JWT_AUDIENCE", help="required 'aud' of JWTs")
    jwt_principal_claim: str = setting("sub", flag="--jwt-principal-claim", env="GPUSCHED_JWT_PRINCIPAL_CLAIM",
                                       help="the JWT claim that names the principal")
    policy_file: str = setting("", flag="--policy-file", env="GPUSCHED_POLICY_FILE",
                               help="JSON bindings of principals to roles (member, team-admin, operator, read-only)")


class AdmissionSettings(Settings):
    """Admission's own settings: its API, retention of finished jobs, the policy bootstrap
    and abuse limits (docs/reference/api-errors.md)."""

    listen: str = setting("127.0.0.1:50051", flag="--listen", help="address of the job API")
    quotas: str = setting("", flag="--quotas",
                          help="JSON file of org/team guarantees, limits and weights: written into each partition's "
                               "log whose log holds no policy yet (a bootstrap; docs/reference/policy.md)")
    job_retention: float = setting(
        DEFAULT_JOB_RETENTION_S, flag="--job-retention", env="GPUSCHED_JOB_RETENTION_S",
        help="seconds (log time) a finished job stays in the state before it is pruned; 0 keeps every job. "
             "Recorded in the log, which every service folds", ge=0, allow_inf_nan=False)
    submit_rate: float = setting(200.0, flag="--submit-rate", env="GPUSCHED_SUBMIT_RATE",
                                 help="jobs a second each team may submit, per admission replica (token bucket; "
                                      "0: no limit)", ge=0, allow_inf_nan=False)
    submit_burst: float = setting(5000.0, flag="--submit-burst", env="GPUSCHED_SUBMIT_BURST",
                                  help="jobs a team may submit at once before the rate applies", ge=0,
                                  allow_inf_nan=False)
    max_pending_per_team: int = setting(50_000, flag="--max-pending-per-team", env="GPUSCHED_MAX_PENDING_PER_TEAM",
                                        help="pending jobs a team may have, as Slurm's MaxSubmitJobs (0: no limit)",
                                        ge=0)
    no_relay: bool = setting(False, flag="--no-relay",
                             help="do not relay node-agents' reports into the pool log (run `gpusched relay` instead)")
    no_work_views: bool = setting(False, flag="--no-work-views", env="GPUSCHED_NO_WORK_VIEWS",
                                  help="the relay does not write the nodes' work views: only where every "
                                       "node-agent runs with --source log (they read nothing else)")


class PlacerSettings(Settings):
    """The placer's own settings."""

    listen: str = setting("127.0.0.1:0", flag="--listen", help="health endpoint")
    queue: str = setting("fair-share", flag="--queue", help="queue-sort policy name")
    placement: str = setting(DEFAULT_PLACEMENT, flag="--placement", help="placement policy name")
    placement_args: dict[str, float] = setting({}, flag="--placement-arg",
                                               help="an argument of the placement policy, e.g. patience=0.2 for "
                                                    "fgd-lookahead (docs/design/scheduling-placement.md)")
    backfill: bool = setting(True, flag="--backfill",
                             help="reserve at once for the first blocked job of each pool (EASY backfill); "
                                  "--no-backfill: only jobs past --reserve-after get reservations")
    reserve_after: float = setting(300.0, flag="--reserve-after",
                                   help="seconds a blocked job waits before it gets a reservation, backfill or "
                                        "not (inf: never)", ge=0)
    pool_reserve_after: dict[str, float] = setting({}, flag="--pool-reserve-after",
                                                   help="--reserve-after for one pool, as POOL=SECONDS")
    reservation_depth: int = setting(2, flag="--reservation-depth",
                                     help="jobs of a pool that hold reservations at once (0: no reservations, "
                                          "no backfill)", ge=0, le=64)
    default_estimate: float = setting(86400.0, flag="--default-estimate",
                                      help="seconds a job is expected to run when neither it nor its pool has a "
                                           "time limit (reservations and backfill)", gt=0, allow_inf_nan=False)
    guarantee_hold: float = setting(1200.0, flag="--guarantee-hold",
                                    help="seconds a team waiting below its guarantee keeps free GPUs back from "
                                         "borrowers after its usage last changed (0: lent at once)",
                                    ge=0, allow_inf_nan=False)
    max_job_test: int = setting(2_500, flag="--max-job-test",
                                help="jobs a scheduling cycle takes from a pool's queue, offered or skipped "
                                     "(Slurm's bf_max_job_test); a cycle that stops on it is continued by the "
                                     "next (--job-test-head)", ge=1)
    # The cycle is bounded by default, as Slurm's max_sched_time is: unbounded, a burst on
    # thousands of nodes makes cycles of up to --max-job-test placements, hundreds of ms
    # with nothing appended meanwhile (docs/guide/running.md). A pool with no more than
    # --min-job-test waiting jobs never meets the bound.
    job_test_head: int = setting(100, flag="--job-test-head",
                                 help="jobs from the head of the queue that a cycle continuing where the last "
                                      "stopped (on --max-job-test or --max-cycle-ms) tests again before the jobs "
                                      "not yet tested (Slurm's bf_continue; >= --max-job-test: every cycle starts "
                                      "at the head)", ge=0)
    max_cycle_ms: float = setting(25.0, flag="--max-cycle-ms",
                                  help="milliseconds after which a scheduling cycle that took --min-job-test jobs "
                                       "stops taking more, continued by the next as on --max-job-test (Slurm's "
                                       "max_sched_time; 0: no bound, decisions that depend on no clock)",
                                  ge=0, allow_inf_nan=False)
    min_job_test: int = setting(150, flag="--min-job-test",
                                help="jobs a scheduling cycle takes from the queue before --max-cycle-ms may stop "
                                     "it: more than --job-test-head, so that a continued cycle reaches jobs not "
                                     "yet tested", ge=1)
    snapshot_every_events: int = setting(50_000, flag="--snapshot-every-events",
                                         help="snapshot an owned pool after this many new events (0: never by count)",
                                         ge=0)
    snapshot_every_s: float = setting(60.0, flag="--snapshot-every-s",
                                      help="snapshot an owned pool that moved at least this often, seconds (0: never "
                                           "by time)", ge=0, allow_inf_nan=False)
    snapshot_in_thread: bool = setting(False, flag="--snapshot-in-thread",
                                       help="copy the state on the event loop and encode it in a thread, instead of "
                                            "encoding it in a forked child (the default where fork exists)")
    no_snapshots: bool = setting(False, flag="--no-snapshots",
                                 help="rebuild newly owned pools from offset 0 instead of their latest snapshot")
    cycle_log: str = setting("", flag="--cycle-log",
                             help="append a line per scheduling cycle to this file: its wall, CPU and GC "
                                  "milliseconds, jobs pending and placed (benchmarks; empty: none)")


    @field_validator("placement_args", "pool_reserve_after", mode="before")
    @classmethod
    def _key_values(cls, value: Any) -> Any:
        """``["patience=0.2", ...]`` from the command line; the keys of placement_args are
        checked against the policy when the placer builds it."""
        if not isinstance(value, (list, tuple)):
            return value
        out: dict[str, str] = {}
        for item in value:
            key, sep, number = str(item).partition("=")
            if not sep or not key.strip():
                raise ValueError(f"expected KEY=VALUE, not {item!r}")
            out[key.strip()] = number.strip()
        return out

    @field_validator("pool_reserve_after")
    @classmethod
    def _waits(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {pool: seconds for pool, seconds in value.items() if not seconds >= 0}
        if bad:
            raise ValueError(f"a pool's wait is seconds >= 0 (inf: never), not {bad}")
        return value

    @model_validator(mode="after")
    def _cycle_moves_on(self) -> "PlacerSettings":
        """A cycle stopped on --max-cycle-ms must reach past the head it tests again, or a
        continued round would never get to the jobs behind it."""
        if self.max_cycle_ms > 0 and self.job_test_head < self.max_job_test and self.min_job_test <= self.job_test_head:
            raise ValueError(f"--min-job-test ({self.min_job_test}) must be above --job-test-head "
                             f"({self.job_test_head}) when --max-cycle-ms bounds a cycle")
        return self


class PreemptorSettings(Settings):
    """The preemptor's own settings (supervision of nodes and jobs, preemption, defragmentation)."""

    listen: str = setting("127.0.0.1:0", flag="--listen", help="health endpoint")
    heartbeat_timeout: float = setting(10.0, flag="--heartbeat-timeout", help="seconds of silence before NodeLost",
                                       gt=0, allow_inf_nan=False)
    min_runtime: float = setting(600.0, flag="--min-runtime",
                                 help="an attempt younger than this (seconds) is not preempted for priority (Slurm's "
                                      "PreemptExemptTime), times --min-runtime-growth per earlier preemption",
                                 ge=0, allow_inf_nan=False)
    min_runtime_growth: float = setting(2.0, flag="--min-runtime-growth",
                                        help="factor on the min runtime for each time the job was already preempted",
                                        ge=1, allow_inf_nan=False)
    max_min_runtime: float = setting(3600.0, flag="--max-min-runtime",
                                     help="the grown min runtime is at most this (seconds): the longest a job "
                                          "that needs victims waits for one to become eligible", ge=0,
                                     allow_inf_nan=False)
    pool_min_runtime: dict[str, float] = setting({}, flag="--pool-min-runtime",
                                                 help="--min-runtime for one pool, as POOL=SECONDS")
    reclaim_min_runtime: float = setting(30.0, flag="--reclaim-min-runtime",
                                         help="a job on borrowed capacity younger than this (seconds) is not "
                                              "reclaimed; neither --min-runtime nor the budget holds a reclaim",
                                         ge=0, allow_inf_nan=False)
    preemption_budget: int = setting(3, flag="--preemption-budget",
                                     help="a job preempted this many times is not preempted for priority any "
                                          "more; quota reclaim still may (0: no budget)", ge=0)
    max_loss_per_wait: float = setting(0.02, flag="--max-loss-per-wait",
                                       help="a preemption's victims lose at most this times the GPU-time its "
                                            "beneficiary waited (GPU-seconds of work since their checkpoints per "
                                            "GPU-second waited), for priority and reclaim alike (inf: no bound)", ge=0)
    reclaim_window: float = setting(600.0, flag="--reclaim-window",
                                    help="a job preempted for quota reclaim is not reclaimed again for this "
                                         "long (seconds), so reclaims between teams settle", ge=0,
                                    allow_inf_nan=False)
    hang_intervals: float = setting(3.0, flag="--hang-intervals",
                                    help="checkpoint intervals without a progress report after which a running "
                                         "job counts as hung", gt=0,
                                    allow_inf_nan=False)
    hang_grace: float = setting(30.0, flag="--hang-grace", help="seconds added to that deadline",
                                ge=0, allow_inf_nan=False)
    actions: str = setting("nodes,attempts,autoscale,preempt,defrag", flag="--actions", env="GPUSCHED_PREEMPTOR_ACTIONS",
                           help="what the preemptor judges each time, in order, comma-separated: nodes, attempts, "
                                "autoscale, preempt, defrag (docs/design/extending.md, 'A preemptor action')")

    @field_validator("pool_min_runtime", mode="before")
    @classmethod
    def _pool_values(cls, value: Any) -> Any:
        return PlacerSettings._key_values(value)

    @field_validator("pool_min_runtime")
    @classmethod
    def _runtimes(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {pool: seconds for pool, seconds in value.items() if not 0 <= seconds < float("inf")}
        if bad:
            raise ValueError(f"a pool's min runtime is finite seconds >= 0, not {bad}")
        return value

    @property
    def action_names(self) -> tuple[str, ...]:
        """The actions named, in order (checked against the registry by
        ``gpusched.policies.actions.make_actions`` when the preemptor starts)."""
        return tuple(name.strip() for name in self.actions.split(",") if name.strip())


class NodeAgentSettings(Settings):
    """A node-agent's own settings: its node, how it runs work, and its usage reports."""

    name: str = setting("", flag="--name", help="node name (default: host name)")
    pool: str = setting("default", flag="--pool", help="the node's pool", min_length=1)
    simulate: str = setting("", flag="--simulate", help="simulated GPUs, e.g. 8xH100-80GB (default: NVML)")
    cpu_milli: int = setting(0, flag="--cpu-milli", help="CPU of the node, milli (0: 16 cores a GPU)", ge=0)
    memory_mib: int = setting(0, flag="--memory-mib", help="memory of the node, MiB (0: 128 GiB a GPU)", ge=0)
    label: tuple[str, ...] = setting((), flag="--label", help="topology label, e.g. rack=r1 (repeatable)")
    heartbeat_interval: float = setting(1.0, flag="--heartbeat-interval", help="seconds between heartbeats",
                                        gt=0, allow_inf_nan=False)
    grace: float = setting(10.0, flag="--grace", help="kill deadline: seconds a stopped workload has to "
                                                      "checkpoint and exit before SIGKILL", gt=0, allow_inf_nan=False)
    drain: float = setting(2.0, flag="--drain", help="seconds a service's replica keeps serving once stopped, "
                                                     "out of its endpoints already, before it is told to stop "
                                                     "(load balancers' time to drop it)", ge=0, le=600,
                           allow_inf_nan=False)
    lease: float = setting(10.0, flag="--lease", help="fencing: workloads are killed when no heartbeat reached "
                                                      "the broker for this long", gt=0, allow_inf_nan=False)
    run_processes: bool = setting(False, flag="--run-processes",
                                  help="with --simulate: run jobs' commands as real processes (CUDA_VISIBLE_DEVICES "
                                       "names the simulated GPUs) instead of simulated runs")
    address: str = setting("", flag="--address", help="address peers of a gang reach this node at "
                                                      "(default: the host name's address)")
    state_dir: str = setting("", flag="--state-dir", help="where workers run and their shims record their end; "
                                                          "must survive agent restarts (default: a folder in /tmp)")
    listen: str = setting("127.0.0.1:0", flag="--listen", help="health endpoint")
    usage_interval: float = setting(5.0, flag="--usage-interval", help="seconds between GPU usage samples "
                                    "published to <prefix>usage (0: off)", ge=0, allow_inf_nan=False)
    simulated_usage: tuple[str, ...] = setting((), flag="--simulated-usage",
                                               help="simulated nodes: jobs named like PATTERN load their GPUs at "
                                                    "PERCENT, e.g. 'notebook-*=0' (PATTERN=PERCENT, repeatable)")
    dynamic_mig: bool = setting(False, flag="--dynamic-mig", help="create and destroy MIG instances to fit placed "
                                                                  "slices (default: existing instances only)")
    mps: Literal["auto", "on", "off"] = setting("auto", flag="--mps", help="whether the CUDA MPS daemon runs here "
                                                                          "(auto: look for its control pipe)")
    fake_nvml: str = setting("", flag="--fake-nvml", help="test harness: GPUs come from a fake NVML described by "
                                                          "this JSON file, not the driver")
    source: Literal["view", "log"] = setting("view", flag="--source",
                                             help="what the agent reads: only its node's work view, "
                                                  "<prefix>work.<node>, written by the relay (view), or its "
                                                  "pool's whole log (log)")

    @field_validator("label")
    @classmethod
    def _key_value(cls, labels: tuple[str, ...]) -> tuple[str, ...]:
        return labels_key_value(labels)


class NodeHostSettings(Settings):
    """A node host's own settings: how many simulated nodes it runs, and of what
    (``gpusched node-host``; docs/guide/running.md, "Many simulated nodes in one process")."""

    name: str = setting("", flag="--name", help="the host's name; its nodes are named NAME-00000, NAME-00001, ... "
                                               "(default: host name)")
    pool: str = setting("default", flag="--pool", help="the pool of every node of the host", min_length=1)
    nodes: int = setting(100, flag="--nodes", help="how many simulated nodes the host runs", ge=1, le=100_000)
    simulate: str = setting("8xH100-80GB", flag="--simulate", help="each node's simulated GPUs, e.g. 8xH100-80GB",
                            min_length=1)
    label: tuple[str, ...] = setting((), flag="--label", help="topology label of every node, e.g. rack=r1 "
                                                            "(repeatable)")
    heartbeat_interval: float = setting(1.0, flag="--heartbeat-interval", help="seconds between the host's beats "
                                        "(one record carries every node's)", gt=0, allow_inf_nan=False)
    grace: float = setting(10.0, flag="--grace", help="kill deadline of a stopped simulated run, seconds",
                           gt=0, allow_inf_nan=False)
    join_concurrency: int = setting(256, flag="--join-concurrency", help="nodes registering at once at start",
                                    ge=1)

    @field_validator("label")
    @classmethod
    def _key_value(cls, labels: tuple[str, ...]) -> tuple[str, ...]:
        return labels_key_value(labels)


def labels_key_value(labels: tuple[str, ...]) -> tuple[str, ...]:
    bad = [label for label in labels if "=" not in label[1:]]
    if bad:
        raise ValueError(f"a label is key=value, e.g. rack=r1 (got {', '.join(map(repr, bad))})")
    return labels


class AccountingSettings(Settings):
    """The audit and billing database, for its consumers and its reports (docs/guide/audit-billing.md)."""

    db: str = setting("sqlite:///gpusched-accounting.db", flag="--db", env="GPUSCHED_ACCOUNTING_DB",
                      help="SQLAlchemy URL: sqlite:///file.db or postgresql://user@host:port/db", min_length=1)


class ConsumerSettings(Settings):
    """The audit and billing consumers' own settings."""

    connect_timeout: float = setting(30.0, flag="--connect-timeout", help="seconds to wait for the broker at start",
                                     gt=0, allow_inf_nan=False)


class ProcessSettings(Settings):
    """Read from the environment only, once per process."""

    native: Literal["0", "1"] = setting("1", env="GPUSCHED_NATIVE",
                                        help="0: run the core as plain Python even where its mypyc build is "
                                             "current (read by gpusched.native)")
    trace_dir: str = setting("", env="GPUSCHED_TRACE_DIR",
                             help="folder of the Alibaba GPU traces for `gpusched simulate` (default: "
                                  "shared/traces/alibaba-v2023 beside the checkout)")
    grpc_max_receive_bytes: int = setting(16 * 1024 * 1024, env="GPUSCHED_GRPC_MAX_RECEIVE_BYTES",
                                          help="largest gRPC message a server accepts", ge=1024)
    grpc_max_send_bytes: int = setting(128 * 1024 * 1024, env="GPUSCHED_GRPC_MAX_SEND_BYTES",
                                       help="largest gRPC message a server sends", ge=1024)
    trace_console: bool = setting(False, env="GPUSCHED_TRACE_CONSOLE", help="1: print spans on the console")
    otlp_endpoint: str = setting("", env="OTEL_EXPORTER_OTLP_ENDPOINT",
                                 help="OTLP/gRPC receiver spans are sent to, e.g. http://127.0.0.1:4317 "
                                      "(docs/reference/observability.md); empty: no tracing")
    metrics_port: int = setting(0, env="GPUSCHED_METRICS_PORT",
                                help="port of the service's Prometheus /metrics endpoint (0: no metrics)",
                                ge=0, le=65535)
    metrics_host: str = setting("127.0.0.1", env="GPUSCHED_METRICS_HOST",
                                help="address the /metrics endpoint listens on")


def process_settings() -> ProcessSettings:
    """This process's environment settings, validated (read when needed, not cached: a
    test may change the environment)."""
    return ProcessSettings.from_env()


def kafka_settings(args: argparse.Namespace) -> KafkaSettings:
    """The Kafka flags as settings, with logging set up at their level; a bad value stops
    the process with a message naming the flag."""
    settings = settings_or_exit(KafkaSettings, args)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return settings


def settings_or_exit(cls, args: argparse.Namespace):
    try:
        return cls.from_args(args)
    except (SettingsError, ValueError) as exc:
        raise SystemExit(f"invalid settings: {exc}")
