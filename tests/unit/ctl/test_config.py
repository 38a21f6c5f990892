"""Endpoint and credentials: flags and GPUSCHED_* over the config file's context."""
from __future__ import annotations

import click
import pytest

from gpusched.ctl.config import Endpoint, resolve

CONFIG = """current-context: prod
contexts:
  local:
    endpoint: 127.0.0.1:50051
  prod:
    endpoint: sched.example.org:443
    ca: ~/ca.pem
    token-file: {token}
"""


@pytest.fixture
def config(tmp_path):
    (tmp_path / "token").write_text("s3cret\n")
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(token=tmp_path / "token"))
    return str(path)


def test_the_current_context_gives_endpoint_tls_and_token(config, monkeypatch):
    monkeypatch.setenv("HOME", "/home/u")
    assert resolve({}, config, None) == Endpoint("sched.example.org:443", ca="/home/u/ca.pem", token="s3cret")


def test_a_named_context_and_flags_win(config):
    assert resolve({}, config, "local") == Endpoint("127.0.0.1:50051")
    assert resolve({"endpoint": "other:1", "token": None}, config, "prod").endpoint == "other:1"


def test_without_a_config_file_the_default_endpoint(tmp_path):
    assert resolve({}, str(tmp_path / "none.yaml"), None) == Endpoint()


@pytest.mark.parametrize("text, message", [
    ("contexts: [a, b]", "contexts: must be a mapping"),
    ("current-context: x\ncontexts: {a: {endpoint: h:1}}", "no context 'x' (contexts: a)"),
    ("current-context: a\ncontexts: {a: {endpont: h:1}}", "contexts.a: unknown key 'endpont'"),
    ("contexts: {a: [", "not YAML"),
])
def test_a_bad_config_file_is_named(tmp_path, text, message):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(click.UsageError) as err:
        resolve({}, str(path), None)
    assert message in str(err.value)


def test_a_token_without_tls_is_refused():
    with pytest.raises(click.UsageError, match="needs TLS"):
        Endpoint(token="t").connect()
