"""How a gpusched gRPC server listens: TLS (optionally mutual) with the auth interceptor,
or the ``--insecure`` dev mode (plaintext, no identity, no checks), which only a
loopback address may use."""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

import grpc

from gpusched.adapters.api.auth import AuthInterceptor
from gpusched.adapters.api.identity import Authenticator, JwtSettings, JwtVerifier, StaticTokens
from gpusched.adapters.api.permissions import Policy
from gpusched.config import SecuritySettings, settings_or_exit


class SecurityConfigError(ValueError):
    """A server's security settings cannot work; the message names the flag."""


@dataclass(frozen=True)
class ServerSecurity:
    credentials: grpc.ServerCredentials | None     # None: plaintext (dev mode)
    interceptors: tuple[grpc.aio.ServerInterceptor, ...]


def is_loopback(listen: str) -> bool:
    """Whether ``host:port`` binds only loopback ("localhost", 127.0.0.0/8, [::1])."""
    host = listen.rsplit(":", 1)[0] if ":" in listen else listen
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False   # "", "0.0.0.0", "[::]" and names: any interface


def _read(flag: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise SecurityConfigError(f"{flag} {path}: {exc.strerror}") from exc


def server_security(settings: SecuritySettings, listen: str) -> ServerSecurity:
    if settings.insecure:
        if not is_loopback(listen):
            raise SecurityConfigError(
                f"--insecure (plaintext, no authentication) is for development on a loopback address only; "
                f"refusing to listen on {listen!r}. Give --tls-cert/--tls-key and a --policy-file instead")
        return ServerSecurity(None, ())
    if not settings.tls_cert or not settings.tls_key:
        raise SecurityConfigError("--tls-cert and --tls-key are required (or --insecure on a loopback address "
                                  "for development; see docs/reference/security.md)")
    if not settings.policy_file:
        raise SecurityConfigError("--policy-file is required: it binds principals to roles")
    if not (settings.tls_client_ca or settings.token_file or settings.jwks_file):
        raise SecurityConfigError("no way to identify callers: give --tls-client-ca (mTLS), --token-file "
                                  "or --jwks-file")
    pair = (_read("--tls-key", settings.tls_key), _read("--tls-cert", settings.tls_cert))
    client_ca = _read("--tls-client-ca", settings.tls_client_ca) if settings.tls_client_ca else None
    credentials = grpc.ssl_server_credentials([pair], root_certificates=client_ca,
                                              require_client_auth=client_ca is not None)
    return ServerSecurity(credentials, (AuthInterceptor(_authenticator(settings), _policy(settings)),))


def _policy(settings: SecuritySettings) -> Policy:
    try:
        return Policy.from_file(settings.policy_file)
    except ValueError as exc:
        raise SecurityConfigError(f"--policy-file {exc}") from exc


def _authenticator(settings: SecuritySettings) -> Authenticator:
    try:
        tokens = StaticTokens.from_file(settings.token_file) if settings.token_file else None
    except (OSError, ValueError) as exc:
        raise SecurityConfigError(f"--token-file {settings.token_file}: {exc}") from exc
    verifier = None
    if settings.jwks_file:
        try:
            verifier = JwtVerifier(JwtSettings(settings.jwks_file, settings.jwt_issuer, settings.jwt_audience,
                                               settings.jwt_principal_claim))
        except Exception as exc:   # OSError, JSON, or PyJWT's key errors: all a bad file
            raise SecurityConfigError(f"--jwks-file {settings.jwks_file}: {exc}") from exc
    return Authenticator(tokens, verifier)


def server_security_from_args(args, listen: str) -> ServerSecurity:
    """The flags of ``SecuritySettings.add_args`` as a ``ServerSecurity`` for a server on
    ``listen`` (``start_server``);
    a setting that cannot work (or ``--insecure`` off loopback) stops the service with a
    message naming the flag."""
    try:
        return server_security(settings_or_exit(SecuritySettings, args), listen)
    except SecurityConfigError as exc:
        raise SystemExit(f"invalid settings: {exc}")
