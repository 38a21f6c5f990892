#!/usr/bin/env bash
# The README's setup-and-run command: install everything (deploy/setup.sh), then run
# `gpusched demo`, which starts the local Kafka broker unless KAFKA_BOOTSTRAP_SERVERS
# names one, a local cluster of real service processes, a mixed workload over gRPC,
# and a report; at the end it says what it left running and how to stop it. Extra args
# go to the demo, e.g. `bash deploy/demo.sh --nodes 8 --jobs 500` or `--serve` to keep
# the cluster up for the gpusched commands.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
bash deploy/setup.sh
exec .venv/bin/gpusched demo "$@"
