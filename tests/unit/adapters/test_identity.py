"""Token verification (gpusched.adapters.api.identity): static tokens, JWTs against a JWKS,
and the loopback check of the dev mode."""
from __future__ import annotations

import json
import time

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from gpusched.adapters.broker import dev_pki
from gpusched.adapters.api.identity import Authenticator, AuthError, JwtSettings, JwtVerifier, StaticTokens
from gpusched.adapters.api.server_security import SecurityConfigError, is_loopback, server_security
from gpusched.config import SecuritySettings


@pytest.fixture
def keys(tmp_path):
    key, jwks = dev_pki.jwt_keypair()
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    rsa_jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(rsa_key.public_key()))
    jwks["keys"].append({**rsa_jwk, "kid": "rsa-1", "alg": "RS256"})
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(jwks))
    return key, rsa_key, str(path)


def _claims(**extra):
    return {"sub": "alice", "exp": int(time.time()) + 300, "iss": "https://idp", "aud": "gpusched", **extra}


def _verifier(path, **settings):
    return JwtVerifier(JwtSettings(path, **{"issuer": "https://idp", "audience": "gpusched", **settings}))


def test_valid_es256_and_rs256_tokens_name_the_principal(keys):
    key, rsa_key, path = keys
    verifier = _verifier(path)
    assert verifier.principal(dev_pki.sign_jwt(key, _claims())) == "alice"
    rs = dev_pki.sign_jwt(rsa_key, _claims(sub="bob"), kid="rsa-1", algorithm="RS256")
    assert verifier.principal(rs) == "bob"
    by_email = _verifier(path, principal_claim="email")
    assert by_email.principal(dev_pki.sign_jwt(key, _claims(email="a@x"))) == "a@x"


def test_invalid_tokens_are_refused(keys):
    key, rsa_key, path = keys
    verifier = _verifier(path)
    other, _ = dev_pki.jwt_keypair()
    bad = {
        "expired": dev_pki.sign_jwt(key, _claims(exp=int(time.time()) - 10)),
        "no exp": dev_pki.sign_jwt(key, {k: v for k, v in _claims().items() if k != "exp"}),
        "other issuer": dev_pki.sign_jwt(key, _claims(iss="https://evil")),
        "other audience": dev_pki.sign_jwt(key, _claims(aud="someone-else")),
        "another key, same kid": dev_pki.sign_jwt(other, _claims()),
        "unknown kid": dev_pki.sign_jwt(key, _claims(), kid="nope"),
        "RS256 key, claimed ES256 kid": dev_pki.sign_jwt(rsa_key, _claims(), kid="dev-1", algorithm="RS256"),
        "HS256 with the public key as secret": jwt.encode(_claims(), "s" * 32, algorithm="HS256",
                                                          headers={"kid": "dev-1"}),
        "alg none": jwt.encode(_claims(), None, algorithm="none", headers={"kid": "dev-1"}),
        "no subject": dev_pki.sign_jwt(key, {k: v for k, v in _claims().items() if k != "sub"}),
        "garbage": "a.b.c",
    }
    for what, token in bad.items():
        with pytest.raises(AuthError):
            verifier.principal(token)
            pytest.fail(what)


def test_a_jwks_with_a_symmetric_key_is_refused(tmp_path):
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [{"kty": "oct", "k": "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0", "kid": "h",
                                          "alg": "HS256"}]}))
    with pytest.raises(ValueError, match="HS256"):
        JwtVerifier(JwtSettings(str(path)))


def test_static_tokens(tmp_path):
    path = tmp_path / "tokens.csv"
    path.write_text("# comment\n\ns3cret,alice\n other , bob \n")
    tokens = StaticTokens.from_file(path)
    assert tokens.principal("s3cret") == "alice" and tokens.principal("other") == "bob"
    assert tokens.principal("s3cre") is None and tokens.principal("") is None
    path.write_text("no-comma\n")
    with pytest.raises(ValueError, match="tokens.csv:1"):
        StaticTokens.from_file(path)


def test_authenticator_order_and_errors(keys):
    key, _, path = keys
    auth = Authenticator(StaticTokens({"tok": "alice"}), _verifier(path))
    assert auth.principal("Bearer tok", None) == "alice"
    assert auth.principal("bearer tok", [b"cert-user"]) == "alice"        # a token wins over a certificate
    assert auth.principal(None, [b"cert-user"]) == "cert-user"
    assert auth.principal("Bearer " + dev_pki.sign_jwt(key, _claims(sub="j")), None) == "j"
    for header in (None, "Basic dG9rOg==", "Bearer ", "Bearer wrong"):
        with pytest.raises(AuthError):
            auth.principal(header, None)


@pytest.mark.parametrize("listen,loopback", [
    ("127.0.0.1:50051", True), ("127.3.4.5:0", True), ("localhost:1", True), ("[::1]:50051", True),
    ("0.0.0.0:50051", False), ("[::]:50051", False), (":50051", False), ("10.0.0.1:1", False),
    ("myhost:1", False),
])
def test_is_loopback(listen, loopback):
    assert is_loopback(listen) is loopback


def test_server_security_refuses_what_cannot_work(tmp_path):
    with pytest.raises(SecurityConfigError, match="loopback"):
        server_security(SecuritySettings(insecure=True), "0.0.0.0:1")
    assert server_security(SecuritySettings(insecure=True), "127.0.0.1:1").credentials is None
    with pytest.raises(SecurityConfigError, match="--tls-cert"):
        server_security(SecuritySettings(), "127.0.0.1:1")
    pki = dev_pki.write(tmp_path, [{"principal": "ops", "role": "operator"}])
    base = dict(tls_cert=str(pki.server_cert), tls_key=str(pki.server_key))
    with pytest.raises(SecurityConfigError, match="--policy-file"):
        server_security(SecuritySettings(**base, token_file=str(pki.token_file)), "0.0.0.0:1")
    with pytest.raises(SecurityConfigError, match="identify callers"):
        server_security(SecuritySettings(**base, policy_file=str(pki.policy)), "0.0.0.0:1")
    with pytest.raises(SecurityConfigError, match="--token-file"):
        server_security(SecuritySettings(**base, policy_file=str(pki.policy), token_file=str(tmp_path / "nope")),
                        "0.0.0.0:1")
    ok = server_security(SecuritySettings(**base, policy_file=str(pki.policy), token_file=str(pki.token_file),
                                          jwks_file=str(pki.jwks), tls_client_ca=str(pki.ca)), "0.0.0.0:1")
    assert ok.credentials is not None and len(ok.interceptors) == 1
