#!/usr/bin/env bash
# Prepare this checkout on a fresh machine (idempotent; seconds on a second run):
#   1. .venv (Python 3.11) with the project installed editable, dev extras included
#   2. protobuf/gRPC Python code generated from proto/gpusched/v1/*.proto into
#      gpusched/v1/, and their descriptor set gpusched/v1/gpusched.desc (for
#      `protoc --decode` by consumers outside gpusched; generated files are gitignored)
#   3. the reducer's modules compiled with mypyc into gpusched/_native/ (seconds;
#      skipped when built for the same sources; plain Python where it cannot build)
#      and the worker shim compiled into services/node-agent/gpusched-shim (without a
#      C compiler the node-agent runs simulated work only, and says so if asked for more)
#   4. the Kafka broker jars in the cache (deploy/kafka.sh fetch)
# Needs: python3.11 (or python3 >= 3.11), Java 17+, Maven (for the Kafka jars); as root
# it installs Java, Maven, PostgreSQL and Chromium (the dashboard's browser tests) from
# Debian's packages where missing.
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
# Chromium: the dashboard's tests load its pages in headless Chromium (docs/dashboard.md).
if ! command -v chromium >/dev/null; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    log "installing Chromium with apt-get (for the dashboard's browser tests)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    log "warning: no chromium: the dashboard's browser tests will be skipped (apt-get install chromium)"
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

# --- 2. generated protobuf / gRPC code ---
shopt -s nullglob
PROTOS=(proto/gpusched/v1/*.proto)
shopt -u nullglob
PROTO_STAMP=.venv/.gpusched-protos
if ((${#PROTOS[@]} == 0)); then
  log "no .proto files yet; skipping code generation"
elif [[ ! -f "$PROTO_STAMP" || "$(cat "$PROTO_STAMP")" != "$REPO" ]] \
    || [[ -n "$(find proto -name '*.proto' -newer "$PROTO_STAMP" | head -n1)" ]] \
    || ! ls gpusched/v1/*_pb2.py >/dev/null 2>&1 || [[ ! -f gpusched/v1/gpusched.desc ]]; then
  log "generating Python code and the descriptor set from ${#PROTOS[@]} .proto files"
  rm -f gpusched/v1/*_pb2.py gpusched/v1/*_pb2.pyi gpusched/v1/*_pb2_grpc.py gpusched/v1/gpusched.desc
  .venv/bin/python -m grpc_tools.protoc -I proto \
    --python_out=. --pyi_out=. --grpc_python_out=. \
    --descriptor_set_out=gpusched/v1/gpusched.desc --include_imports "${PROTOS[@]}"
  echo "$REPO" >"$PROTO_STAMP"
fi

# --- 3. the reducer compiled with mypyc (gpusched.native); plain Python without it ---
.venv/bin/python deploy/build_native.py \
  || log "warning: the reducer runs as plain Python (needs a C compiler and Python headers)"

# --- 3b. the worker shim compiled (services/node-agent/shim.c) ---
SHIM_SRC=services/node-agent/shim.c SHIM_BIN=services/node-agent/gpusched-shim
if [[ ! -x "$SHIM_BIN" || "$SHIM_SRC" -nt "$SHIM_BIN" ]]; then
  ${CC:-cc} -O2 -Wall -o "$SHIM_BIN.tmp" "$SHIM_SRC" -lm && mv "$SHIM_BIN.tmp" "$SHIM_BIN" \
    || log "warning: the worker shim is not built (needs a C compiler): node-agents run simulated work only"
fi

# --- 4. Kafka jars ---
bash deploy/kafka.sh fetch
log "ready"
