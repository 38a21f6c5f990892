#!/usr/bin/env bash
# Prepare this checkout on a fresh machine (idempotent; seconds on a second run):
#   1. .venv (Python 3.11) with the project installed editable, dev extras included
#   2. what the package build generates and compiles, made in the checkout
#      (deploy/build_parts.py; generated files are gitignored): the protobuf/gRPC code of
#      proto/gpusched/v1/*.proto in gpusched/v1/ with its descriptor set
#      gpusched/v1/gpusched.desc, the worker shim services/node-agent/gpusched-shim, and
#      the reducer's modules compiled with mypyc into gpusched/_native/ (skipped when built
#      for the same sources; plain Python where it cannot build)
#   3. the Kafka broker jars in the cache (deploy/kafka.sh fetch)
# Needs: python3.11 (or python3 >= 3.11), Java 17+, Maven (for the Kafka jars); as root
# it installs Java, Maven, PostgreSQL, Chromium (the dashboard's browser tests), nginx and
# systemd (the deployment's tests: docs/guide/deploying.md) from Debian's packages where missing.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
log() { echo "setup.sh: $*" >&2; }

# --- 0. system tools: Java + Maven (installed from Debian packages if missing) ---
if ! command -v java >/dev/null || ! command -v mvn >/dev/null; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    log "installing Java 17 and Maven with apt-get"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      openjdk-17-jre-headless maven >/dev/null
  else
    log "error: java and mvn are required (Java 17+, Maven 3)"; exit 1
  fi
fi
# Chromium: the dashboard's tests load its pages in headless Chromium (docs/guide/dashboard.md).
if ! command -v chromium >/dev/null; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    log "installing Chromium with apt-get (for the dashboard's browser tests)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    log "warning: no chromium: the dashboard's browser tests will be skipped (apt-get install chromium)"
  fi
fi

# nginx and systemd-analyze: the deployment tests start the load balancer in front of
# admission and check the unit files (docs/guide/deploying.md; no systemd needs to run).
if ! command -v nginx >/dev/null || ! compgen -G "/usr/lib/nginx/modules/ngx_stream_module.so" >/dev/null \
    || ! command -v systemd-analyze >/dev/null; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    log "installing nginx (with its stream module) and systemd with apt-get (for the deployment tests)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx libnginx-mod-stream \
      systemd >/dev/null
  else
    log "warning: no nginx or systemd-analyze: the deployment tests will fail (apt-get install nginx" \
      "libnginx-mod-stream systemd)"
  fi
fi

# --- 0b. PostgreSQL server binaries: the accounting database's production option, which
# the tests start on a free port (tests/conftest.py: postgres_server) ---
if ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null && ! command -v initdb >/dev/null; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    log "installing PostgreSQL with apt-get"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  else
    log "warning: PostgreSQL (initdb, pg_ctl) is missing; the PostgreSQL tests of the accounting consumers will fail"
  fi
fi

# --- 1. virtualenv + editable install ---
if [[ ! -x .venv/bin/python ]]; then
  PY="${PYTHON:-}"
  if [[ -z "$PY" ]]; then
    if command -v python3.11 >/dev/null; then PY=python3.11; else PY=python3; fi
  fi
  "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || { log "error: $PY is older than Python 3.11"; exit 1; }
  log "creating .venv with $("$PY" --version)"
  "$PY" -m venv .venv
fi
# Reinstall when pyproject.toml changes or the checkout moved (an editable install
# records absolute paths).
STAMP=.venv/.gpusched-installed
WANT="$(sha256sum pyproject.toml | cut -d' ' -f1) $REPO"
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$WANT" ]]; then
  log "installing gpusched[dev] into .venv (first time takes a few minutes)"
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]' \
    >.venv/pip-install.log 2>&1 \
    || { tail -n 40 .venv/pip-install.log >&2; log "error: pip install failed"; exit 1; }
  echo "$WANT" >"$STAMP"
fi

# --- 2. the generated and compiled parts, as the package build makes them (deploy/build_parts.py):
# the protobuf/gRPC code and its descriptor set, the worker shim, the reducer compiled by
# mypyc; each skipped when newer than its sources. Without a C compiler the reducer runs as
# plain Python and node-agents run simulated work only (it says which) ---
parts=0
.venv/bin/python deploy/build_parts.py || parts=$?
if [[ $parts -eq 3 ]]; then log "warning: some parts are not compiled (above)"; elif [[ $parts -ne 0 ]]; then exit 1; fi

# --- 3. Kafka jars ---
bash deploy/kafka.sh fetch
log "ready"
