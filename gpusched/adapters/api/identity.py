"""Who is calling: bearer tokens (JWTs verified against a JWKS file, or a static token
file) and mutual-TLS client certificates, each naming a principal.

Static token file: one ``token,principal`` per line (as Kubernetes' ``--token-auth-file``);
blank lines and ``#`` comments are skipped. Tokens are looked up by their SHA-256, so a
lookup's time does not depend on how much of a guessed token matches.

JWTs: RS256 or ES256 only (never ``none`` or HS*, whose key would be the public JWKS),
signed by a key of the JWKS file (chosen by ``kid``), with ``exp`` required and, where
configured, the issuer and audience checked. The principal is the ``sub`` claim (or
another claim named in the settings).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import jwt

JWT_ALGORITHMS = ["RS256", "ES256"]


class AuthError(Exception):
    """The caller's credentials are missing or invalid: ``UNAUTHENTICATED``."""


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class StaticTokens:
    def __init__(self, tokens: dict[str, str]) -> None:
        self._by_digest = {_digest(t): p for t, p in tokens.items()}

    @classmethod
    def from_file(cls, path: str | Path) -> "StaticTokens":
        tokens: dict[str, str] = {}
        for n, line in enumerate(Path(path).read_text().splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            token, sep, principal = line.partition(",")
            if not sep or not token.strip() or not principal.strip():
                raise ValueError(f"{path}:{n}: expected 'token,principal'")
            tokens[token.strip()] = principal.strip()
        return cls(tokens)

    def principal(self, token: str) -> str | None:
        return self._by_digest.get(_digest(token))


@dataclass(frozen=True)
class JwtSettings:
    jwks_path: str
    issuer: str = ""
    audience: str = ""
    principal_claim: str = "sub"


class JwtVerifier:
    def __init__(self, settings: JwtSettings) -> None:
        self.settings = settings
        data = json.loads(Path(settings.jwks_path).read_text())
        keys = jwt.PyJWKSet.from_dict(data).keys
        self._keys = {k.key_id: k for k in keys}
        for k in keys:
            if k.algorithm_name not in JWT_ALGORITHMS:
                raise ValueError(f"{settings.jwks_path}: key {k.key_id!r} is {k.algorithm_name}; "
                                 f"only {', '.join(JWT_ALGORITHMS)} keys are accepted")
        if not self._keys:
            raise ValueError(f"{settings.jwks_path}: no usable keys")

    def principal(self, token: str) -> str:
        try:
            header = jwt.get_unverified_header(token)
            key = self._key_for(header.get("kid"))
            # Only the key's own algorithm: a token claiming another for this key (RS256
            # against an EC key, HS256 with the public key as secret) is refused.
            claims = jwt.decode(token, key.key, algorithms=[key.algorithm_name], options={"require": ["exp"]},
                                issuer=self.settings.issuer or None, audience=self.settings.audience or None)
        except jwt.PyJWTError as exc:
            raise AuthError(f"invalid token: {exc}") from exc
        principal = claims.get(self.settings.principal_claim)
        if not isinstance(principal, str) or not principal:
            raise AuthError(f"invalid token: no {self.settings.principal_claim!r} claim")
        return principal

    def _key_for(self, kid: str | None):
        if kid is None and len(self._keys) == 1:
            return next(iter(self._keys.values()))
        key = self._keys.get(kid)
        if key is None:
            raise AuthError(f"invalid token: unknown key id {kid!r}")
        return key


class Authenticator:
    """Credentials of one call -> its principal. A bearer token wins over the client
    certificate: a certificate may belong to a gateway that forwards users' tokens."""

    def __init__(self, tokens: StaticTokens | None = None, jwt_verifier: JwtVerifier | None = None) -> None:
        self.tokens = tokens
        self.jwt = jwt_verifier

    def principal(self, authorization: str | None, peer_identities: list[bytes] | None) -> str:
        if authorization is not None:
            return self._from_bearer(authorization)
        if peer_identities:
            return peer_identities[0].decode()
        raise AuthError("no credentials: send 'authorization: Bearer <token>' or a client certificate")

    def _from_bearer(self, authorization: str) -> str:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthError("authorization: expected 'Bearer <token>'")
        token = token.strip()
        principal = self.tokens.principal(token) if self.tokens else None
        if principal is not None:
            return principal
        if self.jwt is not None and token.count(".") == 2:
            return self.jwt.principal(token)
        raise AuthError("invalid token")
