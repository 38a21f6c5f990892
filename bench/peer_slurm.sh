#!/usr/bin/env bash
# The same job stream through Slurm (Debian's slurm-wlm) and through gpusched on this
# machine, alternating, with the ratios at the end (bench/peer_slurm.py says what is
# measured and how).
#
#   bash bench/peer_slurm.sh [--jobs 200 --rate 50 --seconds 6 --rounds 2 ...]
#
# Installs slurm-wlm with apt-get when slurmctld is missing (as root; deploy/setup.sh
# installs its packages the same way), prepares the checkout (deploy/setup.sh) and starts
# a private Kafka broker on a free port with its data in a temp folder (stopped and
# deleted at the end; KAFKA_BOOTSTRAP_SERVERS set: that broker is used instead). Slurm's
# daemons run as root on loopback (auth/none, no munge), all their files in the run's
# temp folder.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
log() { echo "peer_slurm.sh: $*" >&2; }

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    log "installing Slurm (slurm-wlm) with apt-get"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm >/dev/null
  else
    log "error: Slurm is missing: apt-get install slurm-wlm (as root)"; exit 1
  fi
fi
if [[ $(id -u) -ne 0 ]]; then
  log "error: run as root: the slurmds start jobs as SlurmUser=root"; exit 1
fi

bash deploy/setup.sh

if [[ -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ]]; then
  RUN_DIR="$(mktemp -d -t peer-slurm-kafka-XXXXXX)"
  PORT="$(.venv/bin/python - <<'EOF'
import random, socket
for _ in range(200):   # a port pair (listener, controller) below the ephemeral range
    port = random.randrange(20000, 32000, 2)
    socks = [socket.socket() for _ in range(2)]
    try:
        for i, s in enumerate(socks):
            s.bind(("127.0.0.1", port + i))
    except OSError:
        continue
    finally:
        for s in socks:
            s.close()
    print(port)
    break
EOF
)"
  export GPUSCHED_KAFKA_PORT="$PORT" GPUSCHED_RUN_DIR="$RUN_DIR"
  stop_broker() { bash deploy/kafka.sh stop >/dev/null 2>&1 || true; rm -rf "$RUN_DIR"; }
  trap stop_broker EXIT
  bash deploy/kafka.sh start >/dev/null
  export KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:$PORT"
  log "private Kafka broker at $KAFKA_BOOTSTRAP_SERVERS"
fi

.venv/bin/python bench/peer_slurm.py "$@"
