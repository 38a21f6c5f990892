"""The shipped systemd units and environment files (deploy/systemd), read as systemd reads
them, so that a test starts each service with exactly the command and environment its
unit gives it, on this machine instead of the site the examples name.

A site's values in the shipped files (its brokers, its paths, the example node's name and
the ports) are replaced by this machine's (``Site``); everything else is used as written.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "deploy" / "systemd"
ENV_FILES = UNITS / "env"
PREFIX = "/opt/gpusched"          # where the units expect the package's virtual environment
ETC = "/etc/gpusched"
VAR = "/var/lib"
EXAMPLE_BROKERS = "kafka-1.example.org:9093,kafka-2.example.org:9093,kafka-3.example.org:9093"
EXAMPLE_NODE = "gpu-017"


def unit_entries(path: Path) -> dict[str, list[str]]:
    """The [Service] section's entries, key -> every value in order (systemd allows
    several EnvironmentFile= lines)."""
    entries: dict[str, list[str]] = {}
    section = ""
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "Service":
            key, _, value = line.partition("=")
            entries.setdefault(key.strip(), []).append(value.strip())
    return entries


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines (comments on lines of their own), as systemd's EnvironmentFile=."""
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        key, sep, value = line.partition("=")
        assert sep and not value.startswith(("'", '"')), f"{path}: {line!r} (quoted values are not used here)"
        env[key.strip()] = value
    return env


def expand(command: str, env: dict[str, str]) -> list[str]:
    """ExecStart's variables as systemd expands them: ``$NAME`` splits its value into
    words, ``${NAME}`` stays one word; an unset one expands to nothing."""
    words: list[str] = []
    for word in shlex.split(command):
        whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if whole:
            words.extend(env.get(whole.group(1), "").split())
        else:
            words.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""), word))
    return words


@dataclass
class Site:
    """This machine standing in for the site of the examples."""

    etc: Path                         # for /etc/gpusched
    var: Path                         # for /var/lib
    brokers: str                      # for the example brokers
    node: str                         # for the example node gpu-017
    extra: dict[str, str] = field(default_factory=dict)   # text -> its replacement, where this machine differs

    def env_file(self, name: str, metrics_port: int, listen_port: int) -> Path:
        """The shipped ``env/<name>`` written into ``etc`` with this site's values: paths,
        brokers, node, the given ports, and loopback for every address."""
        text = (ENV_FILES / name).read_text().replace(ETC, str(self.etc)).replace(f"{VAR}/", f"{self.var}/")
        text = text.replace(EXAMPLE_BROKERS, self.brokers).replace(EXAMPLE_NODE, self.node)
        text = text.replace("0.0.0.0", "127.0.0.1")
        text = re.sub(r"(?m)^GPUSCHED_METRICS_PORT=\d+$", f"GPUSCHED_METRICS_PORT={metrics_port}", text)
        text = re.sub(r"--listen 127\.0\.0\.1:\d+", f"--listen 127.0.0.1:{listen_port}", text)
        for old, new in self.extra.items():
            text = text.replace(old, new)
        path = self.etc / name
        path.write_text(text)
        return path

    def service(self, unit: str, instance: str, venv_root: Path) -> tuple[list[str], dict[str, str]]:
        """The command line and environment ``unit`` (instance ``instance`` of a template)
        starts its service with, the package installed at ``venv_root``."""
        entries = unit_entries(UNITS / unit)
        env: dict[str, str] = {}
        for value in entries.get("Environment", []):   # EnvironmentFile= wins over Environment=
            key, _, val = value.partition("=")
            env[key] = val
        for value in entries.get("EnvironmentFile", []):
            optional = value.startswith("-")
            path = Path(value.lstrip("-").replace("%i", instance).replace(ETC, str(self.etc)))
            if optional and not path.exists():
                continue
            env.update(read_env_file(path))
        (command,) = entries["ExecStart"]
        return expand(command.replace(PREFIX, str(venv_root)), env), env
