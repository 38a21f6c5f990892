"""How a client reaches the broker: address, security protocol and login, in one value.

Every aiokafka client of the project (producers, consumers, admin clients, the catch-up
reader process, tests and benchmarks) gets its connection arguments from
``client_args``, so a secured cluster needs its settings given once per service
(``gpusched.config``: flags ``--kafka-*`` or env ``GPUSCHED_KAFKA_*``), never per client.

A plain ``str`` is still accepted where a connection is expected: it means PLAINTEXT to
that bootstrap (a development broker started by ``deploy/kafka.sh`` with its default).
"""
from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Mapping, Union

from gpusched.config import (ENV_BOOTSTRAP, ENV_CA, ENV_MECHANISM, ENV_PASSWORD, ENV_PASSWORD_FILE, ENV_PROTOCOL,
                             ENV_USER, KafkaSettings)

PROTOCOLS = ("PLAINTEXT", "SASL_SSL")
MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")


@dataclass(frozen=True)
class KafkaConnection:
    """Bootstrap servers plus, for ``SASL_SSL``, the SCRAM login and the CA that signed
    the brokers' certificates. ``str()`` is the bootstrap, so log lines stay readable
    and never show the password."""

    bootstrap: str
    security_protocol: str = "PLAINTEXT"
    username: str = ""
    password: str = field(default="", repr=False)
    ca_file: str = ""
    sasl_mechanism: str = "SCRAM-SHA-512"

    def __post_init__(self) -> None:
        if self.security_protocol not in PROTOCOLS:
            raise ValueError(f"kafka security protocol must be one of {PROTOCOLS}, not {self.security_protocol!r}")
        if self.sasl_mechanism not in MECHANISMS:
            raise ValueError(f"kafka SASL mechanism must be one of {MECHANISMS}, not {self.sasl_mechanism!r}")
        if self.secured and not (self.username and self.password and self.ca_file):
            raise ValueError("kafka SASL_SSL needs a user, a password and a CA file "
                             f"({ENV_USER}, {ENV_PASSWORD} or {ENV_PASSWORD_FILE}, {ENV_CA})")

    def __str__(self) -> str:
        return self.bootstrap

    @property
    def secured(self) -> bool:
        return self.security_protocol != "PLAINTEXT"

    def client_args(self) -> dict:
        """Keyword arguments for any aiokafka client (producer, consumer, admin)."""
        args: dict = {"bootstrap_servers": self.bootstrap}
        if self.secured:
            args.update(security_protocol=self.security_protocol, sasl_mechanism=self.sasl_mechanism,
                        sasl_plain_username=self.username, sasl_plain_password=self.password,
                        ssl_context=_ssl_context(self.ca_file))
        return args

    def as_user(self, username: str, password: str) -> "KafkaConnection":
        """The same cluster, logged in as another principal."""
        return replace(self, username=username, password=password)

    def env(self) -> dict[str, str]:
        """This connection as the environment a child process reads (``from_env``)."""
        out = {ENV_BOOTSTRAP: self.bootstrap, ENV_PROTOCOL: self.security_protocol}
        if self.secured:
            out.update({ENV_MECHANISM: self.sasl_mechanism, ENV_USER: self.username,
                        ENV_PASSWORD: self.password, ENV_CA: self.ca_file})
        return out

    @classmethod
    def from_settings(cls, settings: KafkaSettings) -> "KafkaConnection":
        """What every Kafka client of a service is built from (``client_args``)."""
        return cls(bootstrap=settings.bootstrap, security_protocol=settings.security_protocol,
                   sasl_mechanism=settings.sasl_mechanism, username=settings.username,
                   password=settings.password, ca_file=settings.ca_file)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ, bootstrap: str = "") -> "KafkaConnection":
        """The connection ``KafkaSettings`` reads from the environment (``bootstrap``, when
        given, in place of its variable): a process without flags, such as the catch-up
        reader, whose parent passes ``env()``. Raises ``SettingsError``."""
        return cls.from_settings(KafkaSettings.from_env({**env, ENV_BOOTSTRAP: bootstrap} if bootstrap else env))


Where = Union[str, KafkaConnection]


def connection(where: Where) -> KafkaConnection:
    """A connection from either form; a bare bootstrap string is PLAINTEXT."""
    return where if isinstance(where, KafkaConnection) else KafkaConnection(bootstrap=where)


def client_args(where: Where) -> dict:
    """The aiokafka keyword arguments (``bootstrap_servers`` and security) for ``where``."""
    return connection(where).client_args()


def load_credentials(path: str | Path) -> dict[str, str]:
    """``user password`` lines (``deploy/kafka.sh``'s ``secrets/credentials``) as a dict."""
    pairs = (line.split() for line in Path(path).read_text().splitlines() if line.strip())
    return {p[0]: p[1] for p in pairs if len(p) == 2}


@lru_cache(maxsize=8)
def _ssl_context(ca_file: str) -> ssl.SSLContext:
    # One context per CA for the whole process: loading the CA is the costly part.
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"kafka CA file {ca_file}: {exc}") from None


class KafkaLoginRefused(RuntimeError):
    """A broker refused this connection's login or certificate: retrying cannot help."""


async def check_login(where: Where, timeout_s: float = 5.0) -> None:
    """Raise ``KafkaLoginRefused`` if a bootstrap broker refuses the login (wrong user or
    password, mechanism not enabled, a certificate the CA did not sign). A broker that
    does not answer yet passes: that is for the caller's retry loop. aiokafka only logs
    why a bootstrap failed, so a refused login would otherwise look like a broker down."""
    from aiokafka.conn import create_conn
    from aiokafka.errors import (AuthenticationFailedError, SaslAuthenticationFailed,
                                 UnsupportedSaslMechanismError)

    conn = connection(where)
    if not conn.secured:
        return
    args = conn.client_args()
    del args["bootstrap_servers"]
    for address in conn.bootstrap.split(","):
        host, port = address.strip().rsplit(":", 1)
        try:
            link = await create_conn(host, int(port), request_timeout_ms=int(timeout_s * 1000), **args)
        except (AuthenticationFailedError, SaslAuthenticationFailed, UnsupportedSaslMechanismError) as exc:
            raise KafkaLoginRefused(f"Kafka broker {address} refused the login of user {conn.username!r} "
                                    f"({conn.sasl_mechanism}): {exc}") from None
        except ssl.SSLCertVerificationError as exc:
            raise KafkaLoginRefused(f"Kafka broker {address}: its certificate does not verify against "
                                    f"CA {conn.ca_file}: {exc.verify_message}") from None
        except Exception:   # not up yet, or unreachable: the caller retries
            continue
        link.close()
        return
