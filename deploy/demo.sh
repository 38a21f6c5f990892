#!/usr/bin/env bash
# The README's setup-and-run command: install everything (deploy/setup.sh), start the
# local Kafka broker, then run `gpusched demo` (a local cluster of real service
# processes, a mixed workload over gRPC, and a report). Extra args go to the demo,
# e.g. `bash deploy/demo.sh --nodes 8 --jobs 500`.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
bash deploy/setup.sh
if [[ -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ]]; then
  bash deploy/kafka.sh start >/dev/null
fi
exec .venv/bin/gpusched demo "$@"
