#!/usr/bin/env bash
# The test command: set up (deploy/setup.sh), then pytest with any extra args,
# e.g. `bash deploy/test.sh tests/integration -v` or `bash deploy/test.sh -m "not broker"`.
# The Kafka broker is started and stopped by the pytest fixtures (tests/conftest.py).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

bash deploy/setup.sh
# The tracing and metrics back ends the tests start (Jaeger, Prometheus): built once into
# the cache, here rather than inside a test, whose time limit a first build would exceed.
bash deploy/observability.sh fetch

# Safety net: tests/conftest.py notes each broker cluster it starts in this file, one
# "port run_dir [nodes]" line each; if pytest dies without running its teardown, stop
# them here.
NOTE="$(mktemp)"
export GPUSCHED_TEST_BROKER_NOTE="$NOTE"
stop_test_broker() {
  local port run_dir nodes
  while read -r port run_dir nodes; do
    [[ -n "$run_dir" ]] || continue
    env -u KAFKA_BOOTSTRAP_SERVERS GPUSCHED_KAFKA_PORT="$port" GPUSCHED_RUN_DIR="$run_dir" \
      GPUSCHED_KAFKA_BROKERS="${nodes:-1}" bash deploy/kafka.sh stop >/dev/null 2>&1 || true
  done <"$NOTE" 2>/dev/null || true
  rm -f "$NOTE"
}
trap stop_test_broker EXIT

rc=0
.venv/bin/python -m pytest -q "$@" || rc=$?
if [[ $rc -eq 5 ]]; then
  echo "test.sh: pytest collected no tests (exit 5); treating that as a failure" >&2
  exit 1
fi
exit "$rc"
