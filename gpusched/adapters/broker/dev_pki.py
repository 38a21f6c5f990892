"""Throwaway credentials for development, the demo and the tests: a CA, a server
certificate for loopback, client certificates (mTLS principals), a static token file,
a JWKS with its signing key, and a policy file binding them to roles.

Never for production: the keys are unencrypted files and the CA signs anything asked.

    python -m gpusched.adapters.broker.dev_pki DIR [--member alice:nlp] [--operator ops] ...
"""
from __future__ import annotations

import argparse
import datetime
import ipaddress
import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_DAY = datetime.timedelta(days=1)
JWT_KID = "dev-1"


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(subject: str, issuer: x509.Name, public_key, days: int) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer)
            .public_key(public_key).serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY).not_valid_after(now + days * _DAY))


@dataclass
class Ca:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def create(cls, common_name: str = "gpusched dev CA", days: int = 30) -> "Ca":
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (_builder(common_name, _name(common_name), key.public_key(), days)
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .sign(key, hashes.SHA256()))
        return cls(key, cert)

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, common_name: str, *, server: bool = False, days: int = 30,
              addresses: tuple[str, ...] = ()) -> tuple[bytes, bytes]:
        """(key PEM, certificate PEM). A server certificate names localhost, the
        loopback addresses and ``addresses`` (IPs); a client certificate only its common
        name (the principal)."""
        key = ec.generate_private_key(ec.SECP256R1())
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (_builder(common_name, self.cert.subject, key.public_key(), days)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                x509.IPAddress(ipaddress.ip_address("::1")),
                *(x509.IPAddress(ipaddress.ip_address(a)) for a in addresses)]), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return _pem_key(key), cert.public_bytes(serialization.Encoding.PEM)


def jwt_keypair(kid: str = JWT_KID) -> tuple[ec.EllipticCurvePrivateKey, dict]:
    """An ES256 signing key and the JWKS that verifies it."""
    key = ec.generate_private_key(ec.SECP256R1())
    public = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
    return key, {"keys": [{**public, "kid": kid, "alg": "ES256", "use": "sig"}]}


def sign_jwt(key, claims: dict, kid: str = JWT_KID, algorithm: str = "ES256") -> str:
    return jwt.encode(claims, key, algorithm=algorithm, headers={"kid": kid})


@dataclass
class DevPki:
    """Where ``write`` put everything, and each principal's bearer token."""

    directory: Path
    tokens: dict[str, str] = field(default_factory=dict)     # principal -> static token

    def path(self, name: str) -> Path:
        return self.directory / name

    @property
    def ca(self) -> Path:
        return self.path("ca.pem")

    @property
    def server_cert(self) -> Path:
        return self.path("server.pem")

    @property
    def server_key(self) -> Path:
        return self.path("server-key.pem")

    @property
    def token_file(self) -> Path:
        return self.path("tokens.csv")

    @property
    def jwks(self) -> Path:
        return self.path("jwks.json")

    @property
    def jwt_key(self) -> Path:
        return self.path("jwt-key.pem")

    @property
    def policy(self) -> Path:
        return self.path("policy.json")

    def client_cert(self, principal: str) -> tuple[Path, Path]:
        return self.path(f"client-{principal}.pem"), self.path(f"client-{principal}-key.pem")

    def server_flags(self, mtls: bool = True) -> list[str]:
        flags = ["--tls-cert", str(self.server_cert), "--tls-key", str(self.server_key),
                 "--token-file", str(self.token_file), "--jwks-file", str(self.jwks),
                 "--policy-file", str(self.policy)]
        return flags + (["--tls-client-ca", str(self.ca)] if mtls else [])


def write(directory: Path, bindings: list[dict], client_certs: tuple[str, ...] = (),
          server_addresses: tuple[str, ...] = ()) -> DevPki:
    """A CA, server certificate (for loopback and ``server_addresses``), a token per
    principal of ``bindings``, client certificates for ``client_certs``, a JWKS and its
    key, and the policy file."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = DevPki(directory)
    ca = Ca.create()
    pki.ca.write_bytes(ca.pem)
    key, cert = ca.issue("localhost", server=True, addresses=server_addresses)
    pki.server_key.write_bytes(key)
    pki.server_cert.write_bytes(cert)
    for principal in client_certs:
        key, cert = ca.issue(principal)
        cert_path, key_path = pki.client_cert(principal)
        cert_path.write_bytes(cert)
        key_path.write_bytes(key)
    pki.tokens = {b["principal"]: secrets.token_urlsafe(32) for b in bindings}
    pki.token_file.write_text("# token,principal (dev only)\n"
                              + "".join(f"{t},{p}\n" for p, t in pki.tokens.items()))
    jwt_key, jwks = jwt_keypair()
    pki.jwt_key.write_bytes(_pem_key(jwt_key))
    pki.jwks.write_text(json.dumps(jwks))
    pki.policy.write_text(json.dumps({"bindings": bindings}, indent=2))
    for secret in directory.glob("*key*.pem"):
        secret.chmod(0o600)
    secret_tokens = pki.token_file
    secret_tokens.chmod(0o600)
    return pki


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gpusched.adapters.broker.dev_pki", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory")
    parser.add_argument("--member", action="append", default=[], metavar="PRINCIPAL:TEAM")
    parser.add_argument("--team-admin", action="append", default=[], metavar="PRINCIPAL:TEAM")
    parser.add_argument("--operator", action="append", default=[], metavar="PRINCIPAL")
    parser.add_argument("--read-only", action="append", default=[], metavar="PRINCIPAL")
    args = parser.parse_args(argv)
    bindings = []
    for role, entries in (("member", args.member), ("team-admin", args.team_admin)):
        for entry in entries:
            principal, sep, team = entry.partition(":")
            if not sep or not principal or not team:
                parser.error(f"--{role} {entry!r}: expected PRINCIPAL:TEAM")
            bindings.append({"principal": principal, "role": role, "team": team})
    bindings += [{"principal": p, "role": "operator"} for p in args.operator]
    bindings += [{"principal": p, "role": "read-only"} for p in args.read_only]
    if not bindings:
        bindings = [{"principal": "dev", "role": "operator"}]
    pki = write(Path(args.directory), bindings, tuple(dict.fromkeys(b["principal"] for b in bindings)))
    print(f"wrote {pki.directory}: ca.pem, server.pem, server-key.pem, client-<principal>.pem, tokens.csv, "
          f"jwks.json, policy.json\nserver flags: {' '.join(pki.server_flags())}")


if __name__ == "__main__":
    main()
