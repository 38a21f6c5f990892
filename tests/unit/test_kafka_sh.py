"""deploy/kafka.sh keeps the SCRAM passwords off every command line (``ps`` shows them to
every local user): a secured start, with a stand-in ``java`` on the PATH that records the
command lines it was given (and the argument files they name, as the JVM reads them)."""
from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from gpusched.adapters.broker.kafka_principals import NAMES
from gpusched.ports import free_port

REPO = Path(__file__).resolve().parents[2]

FAKE_JAVA = r"""#!/usr/bin/env bash
# Records its command line; an @FILE argument's content too, as the JVM would expand it.
{
  printf 'argv:'; printf ' %s' "$@"; printf '\n'
  for a in "$@"; do
    if [[ "$a" == @* ]]; then printf 'argfile %s:\n' "${a#@}"; cat "${a#@}"; fi
  done
} >>"$JAVA_LOG"
for a in "$@"; do
  case "$a" in
    random-uuid) echo "kq3Bd9rUQp2bC7yF0m1x_A"; exit 0 ;;
    kafka.Kafka) exit 1 ;;   # no broker: the start fails, after the format
  esac
done
exit 0
"""


def test_a_secured_start_passes_no_password_on_a_command_line(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    java = bin_dir / "java"
    java.write_text(FAKE_JAVA)
    java.chmod(0o755)
    libs = tmp_path / "cache" / "kafka-test" / "libs"
    libs.mkdir(parents=True)
    (libs / ".complete").touch()
    run = tmp_path / "run"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "JAVA_LOG": str(tmp_path / "java.log"),
           "GPUSCHED_RUN_DIR": str(run), "GPUSCHED_CACHE": str(tmp_path / "cache"), "GPUSCHED_KAFKA_VERSION": "test",
           "GPUSCHED_KAFKA_SECURITY": "sasl_ssl", "GPUSCHED_KAFKA_PORT": str(free_port()),
           "GPUSCHED_KAFKA_START_TIMEOUT": "10"}
    env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    started = subprocess.run(["bash", str(REPO / "deploy" / "kafka.sh"), "start"], env=env, cwd=REPO, text=True,
                             capture_output=True, timeout=120)
    assert started.returncode != 0 and "exited during startup" in started.stderr, started.stderr[-2000:]

    secrets = run / "kafka" / "secrets"
    passwords = dict(line.split() for line in (secrets / "credentials").read_text().splitlines())
    assert list(passwords) == list(NAMES)   # one user per principal of the package's list, no other
    record = (tmp_path / "java.log").read_text()
    command_lines = [line for line in record.splitlines() if line.startswith("argv:")]
    assert any("kafka.Kafka" in line for line in command_lines)   # the broker was started (after the format)
    for user, password in passwords.items():
        assert not any(password in line for line in command_lines), f"{user}'s password on a command line"
    # the format still got every user, through its argument file, which is gone afterwards
    [argfile] = [line.split(" ", 1)[1].rstrip(":") for line in record.splitlines() if line.startswith("argfile ")]
    assert not Path(argfile).exists()
    for user, password in passwords.items():
        assert f"--add-scram\nSCRAM-SHA-512=[name={user},password={password}]" in record
    # the broker's settings hold the admin's password: its owner's to read only
    assert stat.S_IMODE((run / "kafka" / "server.properties").stat().st_mode) == 0o600
