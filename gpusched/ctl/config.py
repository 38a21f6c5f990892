"""Where the API is and who the caller is, as kubeconfig does it: flags, then
environment, then the current context of ``~/.config/gpusched/config.yaml``.

    current-context: prod
    contexts:
      local:
        endpoint: 127.0.0.1:50051          # insecure dev mode: no ca, no token
      prod:
        endpoint: sched.example.org:443
        ca: ~/.config/gpusched/ca.pem       # the CA of the server's certificate (TLS)
        cert: ~/.config/gpusched/me.pem     # mutual TLS: this client's certificate...
        key: ~/.config/gpusched/me-key.pem  # ...and key
        token-file: ~/.config/gpusched/token   # or token: <bearer token>
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import click
import yaml

from gpusched.client import DEFAULT_ENDPOINT, ClientTls, Retry, SyncClient, connect

CONFIG_KEYS = {"endpoint", "ca", "cert", "key", "token", "token-file"}
CLI_RETRY_S = 10.0


def default_config_path() -> Path:
    """The config file when ``--config`` (or its variable ``GPUSCHED_CONFIG``, which click
    reads for it: ``ctl/root.py``) names none."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpusched" / "config.yaml"


@dataclass(frozen=True)
class Endpoint:
    endpoint: str = DEFAULT_ENDPOINT
    ca: str = ""
    cert: str = ""
    key: str = ""
    token: str = ""

    def connect(self) -> SyncClient:
        tls = ClientTls.from_files(self.ca, self.cert or None, self.key or None) if self.ca else None
        if self.token and tls is None:
            raise click.UsageError("a token needs TLS: give --ca (or ca: in the context)")
        # a person waits at the prompt: give up sooner than a program would (docs/reference/cli.md)
        return connect(self.endpoint, tls, self.token, Retry(budget_s=CLI_RETRY_S))


def load_context(path: Path, name: str) -> dict[str, str]:
    """The named context (``current-context`` when ``name`` is empty); {} without a file."""
    if not path.exists():
        if name:
            raise click.UsageError(f"--context {name}: no config file {path}")
        return {}
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise click.UsageError(f"{path}: not YAML: {exc}") from None
    contexts = doc.get("contexts") or {} if isinstance(doc, dict) else None
    if not isinstance(contexts, dict):
        raise click.UsageError(f"{path}: contexts: must be a mapping of name -> settings")
    name = name or doc.get("current-context", "")
    if not name:
        return {}
    if name not in contexts:
        raise click.UsageError(f"{path}: no context {name!r} (contexts: {', '.join(contexts) or 'none'})")
    context = contexts[name] or {}
    unknown = set(context) - CONFIG_KEYS if isinstance(context, dict) else {"(not a mapping)"}
    if unknown:
        raise click.UsageError(f"{path}: contexts.{name}: unknown key {sorted(unknown)[0]!r} "
                               f"(known: {', '.join(sorted(CONFIG_KEYS))})")
    return {k: str(v) for k, v in context.items()}


def resolve(flags: dict[str, str | None], config_path: str | None, context: str | None) -> Endpoint:
    """Flags (click fills them from GPUSCHED_* too) over the config file's context."""
    settings = load_context(Path(config_path) if config_path else default_config_path(), context or "")
    endpoint = Endpoint(**{k: os.path.expanduser(v) if k in ("ca", "cert", "key") else v
                           for k, v in settings.items() if k not in ("token-file",)})
    if settings.get("token-file"):
        endpoint = replace(endpoint, token=_read_token(settings["token-file"]))
    given = {k: v for k, v in flags.items() if v}
    if given.get("token_file"):
        given["token"] = _read_token(given.pop("token_file"))
    given.pop("token_file", None)
    return replace(endpoint, **given)


def _read_token(path: str) -> str:
    try:
        return Path(os.path.expanduser(path)).read_text().strip()
    except OSError as exc:
        raise click.UsageError(f"token file {path}: {exc.strerror}") from None
