"""Service configuration, validated with pydantic: flags and environment in, typed settings out."""
from __future__ import annotations

import argparse
import logging
import os

from pydantic import BaseModel, Field

from gpusched.adapters.kafka_admin import TopicNames
from gpusched.adapters.kafka_security import (ENV_CA, ENV_MECHANISM, ENV_PASSWORD, ENV_PASSWORD_FILE, ENV_PROTOCOL,
                                              ENV_USER, KafkaConnection, read_password)


# A finished job stays queryable this long after it ended (log time), then it leaves the
# state (gpusched.core.retention); its history stays in the log. Admission records its
# ``--job-retention`` (this by default) in each partition's log as a JobRetentionSet.
DEFAULT_JOB_RETENTION_S = 3600.0


class KafkaSettings(BaseModel):
    """Where the log is: all services of a cluster share these."""

    bootstrap: str = Field(min_length=3)
    topic_prefix: str = "gpusched."
    partitions: int = Field(default=4, ge=1, le=1024)
    # Security (gpusched.adapters.kafka_security): PLAINTEXT, or SASL_SSL with this
    # service's own SCRAM principal and the CA of the brokers' certificates.
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str = "SCRAM-SHA-512"
    username: str = ""
    password: str = Field(default="", repr=False)
    ca_file: str = ""
    # Topics this service creates: 0 follows the cluster (3+ brokers: 3 copies and 2 in
    # sync; fewer: one each). Existing topics below these are reported at start.
    replication_factor: int = Field(default=0, ge=0, le=16)
    min_insync_replicas: int = Field(default=0, ge=0, le=16)

    @property
    def topics(self) -> TopicNames:
        return TopicNames(self.topic_prefix)

    @property
    def connection(self) -> KafkaConnection:
        """What every Kafka client of the service is built from (``client_args``)."""
        return KafkaConnection(bootstrap=self.bootstrap, security_protocol=self.security_protocol,
                               sasl_mechanism=self.sasl_mechanism, username=self.username,
                               password=self.password, ca_file=self.ca_file)


def add_kafka_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092"),
                        help="Kafka bootstrap servers (env KAFKA_BOOTSTRAP_SERVERS)")
    parser.add_argument("--topic-prefix", default=os.environ.get("GPUSCHED_TOPIC_PREFIX", "gpusched."))
    # String defaults from the environment go through ``type`` like a flag would, so a bad
    # value is argparse's clear error ("invalid float value"), not a traceback.
    parser.add_argument("--partitions", type=int, default=os.environ.get("GPUSCHED_PARTITIONS", "4"),
                        help="partitions of the cluster-events topic (pools hash onto them)")
    parser.add_argument("--log-level", default=os.environ.get("GPUSCHED_LOG_LEVEL", "INFO"))
    env = os.environ.get
    parser.add_argument("--kafka-security-protocol", default=env(ENV_PROTOCOL, "PLAINTEXT").upper(),
                        choices=("PLAINTEXT", "SASL_SSL"), help=f"env {ENV_PROTOCOL}")
    parser.add_argument("--kafka-sasl-mechanism", default=env(ENV_MECHANISM, "SCRAM-SHA-512").upper(),
                        choices=("SCRAM-SHA-512", "SCRAM-SHA-256"), help=f"env {ENV_MECHANISM}")
    parser.add_argument("--kafka-user", default=env(ENV_USER, ""), help=f"SCRAM user (env {ENV_USER})")
    # The password itself only from the environment or a file: a flag would show in ``ps``.
    parser.add_argument("--kafka-password-file", default=env(ENV_PASSWORD_FILE, ""),
                        help=f"file holding the SCRAM password (env {ENV_PASSWORD_FILE}; or env {ENV_PASSWORD})")
    parser.add_argument("--kafka-ca", default=env(ENV_CA, ""), help=f"CA of the brokers' certificates (env {ENV_CA})")
    parser.add_argument("--replication-factor", type=int, default=env("GPUSCHED_REPLICATION_FACTOR", "0"),
                        help="copies of each topic created (0: 3 on a cluster of 3+ brokers, else 1)")
    parser.add_argument("--min-insync-replicas", type=int, default=env("GPUSCHED_MIN_INSYNC_REPLICAS", "0"),
                        help="min.insync.replicas of the topics (0: replication factor - 1, at least 1)")


def kafka_settings(args: argparse.Namespace) -> KafkaSettings:
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from gpusched.adapters.eventlog import parallel_replay_min_from_env

    try:
        parallel_replay_min_from_env()   # read by every LogFollower: fail here, with its name
        settings = KafkaSettings(
            bootstrap=args.bootstrap, topic_prefix=args.topic_prefix, partitions=args.partitions,
            security_protocol=args.kafka_security_protocol, sasl_mechanism=args.kafka_sasl_mechanism,
            username=args.kafka_user, ca_file=args.kafka_ca,
            password=read_password(os.environ.get(ENV_PASSWORD, ""), args.kafka_password_file),
            replication_factor=args.replication_factor, min_insync_replicas=args.min_insync_replicas)
        settings.connection   # a SASL_SSL without its login fails here, naming what is missing
        return settings
    except ValueError as exc:
        raise SystemExit(f"invalid settings: {exc}")


def retention_seconds(text: str) -> float:
    """argparse ``type`` of ``--job-retention``: seconds, finite and >= 0."""
    value = float(text)
    if not 0.0 <= value < float("inf"):
        raise ValueError(text)
    return value


def add_security_args(parser: argparse.ArgumentParser) -> None:
    """The gRPC server's TLS, identity and policy flags, the same for every service
    (docs/security.md). Each also reads an environment variable, as the Kafka flags do."""
    env = os.environ.get
    group = parser.add_argument_group("API security (docs/security.md)")
    group.add_argument("--insecure", action="store_true", default=env("GPUSCHED_INSECURE", "") == "1",
                       help="development only: plaintext gRPC, no authentication, every call allowed; "
                            "refused on a non-loopback --listen (env GPUSCHED_INSECURE=1)")
    group.add_argument("--tls-cert", default=env("GPUSCHED_TLS_CERT", ""), help="server certificate (PEM)")
    group.add_argument("--tls-key", default=env("GPUSCHED_TLS_KEY", ""), help="server private key (PEM)")
    group.add_argument("--tls-client-ca", default=env("GPUSCHED_TLS_CLIENT_CA", ""),
                       help="CA bundle (PEM): clients must present a certificate it signed (mutual TLS); the "
                            "certificate's SAN (else its CN) is the principal")
    group.add_argument("--token-file", default=env("GPUSCHED_TOKEN_FILE", ""),
                       help="static bearer tokens, one 'token,principal' per line")
    group.add_argument("--jwks-file", default=env("GPUSCHED_JWKS_FILE", ""),
                       help="JWKS (JSON) whose keys sign bearer JWTs (RS256/ES256)")
    group.add_argument("--jwt-issuer", default=env("GPUSCHED_JWT_ISSUER", ""), help="required 'iss' of JWTs")
    group.add_argument("--jwt-audience", default=env("GPUSCHED_JWT_AUDIENCE", ""), help="required 'aud' of JWTs")
    group.add_argument("--jwt-principal-claim", default=env("GPUSCHED_JWT_PRINCIPAL_CLAIM", "sub"),
                       help="the JWT claim that names the principal")
    group.add_argument("--policy-file", default=env("GPUSCHED_POLICY_FILE", ""),
                       help="JSON bindings of principals to roles (member, team-admin, operator, read-only)")


def server_security(args: argparse.Namespace):
    """The flags as a ``ServerSecurity`` for ``start_server``; a setting that cannot work
    (or ``--insecure`` off loopback) stops the service with a message naming the flag."""
    from gpusched.adapters import server_security as sec

    settings = sec.SecuritySettings(
        insecure=args.insecure, tls_cert=args.tls_cert, tls_key=args.tls_key, tls_client_ca=args.tls_client_ca,
        token_file=args.token_file, jwks_file=args.jwks_file, jwt_issuer=args.jwt_issuer,
        jwt_audience=args.jwt_audience, jwt_principal_claim=args.jwt_principal_claim, policy_file=args.policy_file)
    try:
        return sec.server_security(settings, args.listen)
    except sec.SecurityConfigError as exc:
        raise SystemExit(f"invalid settings: {exc}")
