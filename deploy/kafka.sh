#!/usr/bin/env bash
# Local Apache Kafka (4.x, KRaft, no ZooKeeper) for development and tests.
#
#   deploy/kafka.sh fetch    resolve the broker jars into the cache (idempotent)
#   deploy/kafka.sh start    format storage once, start one broker+controller on
#                            loopback, wait until it answers, print the bootstrap
#   deploy/kafka.sh stop     SIGTERM (controlled shutdown), SIGKILL after 30 s
#   deploy/kafka.sh status   "running ..." (exit 0) or "not running" (exit 3)
#   deploy/kafka.sh kill     SIGKILL (simulated crash; data stays, next start recovers)
#   deploy/kafka.sh clean    stop, then delete the data and logs
#   deploy/kafka.sh logs     tail the broker log
#
# Environment:
#   GPUSCHED_KAFKA_VERSION       Kafka version (default below)
#   GPUSCHED_CACHE               jar cache root (default ~/.cache/gpusched)
#   GPUSCHED_KAFKA_PORT          PLAINTEXT port (default 19092); controller uses port+1
#   GPUSCHED_RUN_DIR             run dir (default <repo>/.run); data+logs in <run>/kafka
#   GPUSCHED_KAFKA_HEAP          JVM heap (default 768m)
#   GPUSCHED_KAFKA_JVM_OPTS      more JVM options for the broker (e.g. -XX:TieredStopAtLevel=4)
#   GPUSCHED_KAFKA_START_TIMEOUT seconds to wait for the broker (default 90)
#   KAFKA_BOOTSTRAP_SERVERS      use this existing cluster: start/status only check
#                                that it answers, stop does nothing
#
# Data survives stop/start (restarts reuse the formatted log dir); only `clean`
# wipes it.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KAFKA_VERSION="${GPUSCHED_KAFKA_VERSION:-4.4.0}"
CACHE="${GPUSCHED_CACHE:-$HOME/.cache/gpusched}"
KAFKA_HOME="$CACHE/kafka-$KAFKA_VERSION"
LIBS="$KAFKA_HOME/libs"
PORT="${GPUSCHED_KAFKA_PORT:-19092}"
CONTROLLER_PORT="$((PORT + 1))"
RUN_ROOT="${GPUSCHED_RUN_DIR:-$REPO/.run}"
RUN_DIR="$RUN_ROOT/kafka"
DATA_DIR="$RUN_DIR/data"
LOG_DIR="$RUN_DIR/logs"
PROPS="$RUN_DIR/server.properties"
LOG4J="$RUN_DIR/log4j2.properties"
PID_FILE="$RUN_DIR/kafka.pid"
HEAP="${GPUSCHED_KAFKA_HEAP:-768m}"
START_TIMEOUT="${GPUSCHED_KAFKA_START_TIMEOUT:-90}"
BOOTSTRAP="127.0.0.1:$PORT"
# maven-dependency-plugin pinned so resolution does not depend on Maven's defaults.
DEP_PLUGIN="org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

log() { echo "kafka.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

python_bin() {
  # The project venv has aiokafka (a real metadata round trip); any python3 will
  # do for the raw-socket fallback.
  if [[ -n "${GPUSCHED_PYTHON:-}" ]]; then echo "$GPUSCHED_PYTHON"
  elif [[ -x "$REPO/.venv/bin/python" ]]; then echo "$REPO/.venv/bin/python"
  else command -v python3
  fi
}

# wait_ready BOOTSTRAP TIMEOUT [PID]: succeed once the cluster answers a metadata
# request listing at least one (unfenced) broker; fail early if PID dies.
wait_ready() {
  "$(python_bin)" - "$1" "$2" "${3:-}" <<'PY'
import asyncio, os, socket, struct, sys, time

bootstrap, timeout, pid = sys.argv[1], float(sys.argv[2]), sys.argv[3]
deadline = time.monotonic() + timeout

def alive():
    if not pid:
        return True
    try:  # a zombie (state Z) counts as dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

async def probe_aiokafka():
    from aiokafka.admin import AIOKafkaAdminClient
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    try:
        await admin.start()
        meta = await admin.describe_cluster()
        # KRaft brokers leave fenced brokers out of metadata, so a non-empty list
        # means a broker is registered and can host partitions.
        return bool(meta.get("brokers"))
    finally:
        await admin.close()

def probe_socket():
    # ApiVersions v0 (always supported): answered once request processing is on.
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    client = b"gpusched-ready"
    body = struct.pack(">hhih", 18, 0, 1, len(client)) + client
    with socket.create_connection((host, int(port)), timeout=3) as s:
        s.sendall(struct.pack(">i", len(body)) + body)
        head = s.recv(10)
        return len(head) >= 10 and struct.unpack(">h", head[8:10])[0] == 0

try:
    import aiokafka  # noqa: F401
    probe = lambda: asyncio.run(probe_aiokafka())
except ImportError:
    probe = probe_socket

import logging
logging.disable(logging.CRITICAL)  # aiokafka logs every refused connection
while True:
    if not alive():
        sys.exit(2)
    try:
        if probe():
            sys.exit(0)
    except Exception:
        pass
    if time.monotonic() > deadline:
        sys.exit(1)
    time.sleep(0.5)
PY
}

alive() {
  # kill -0 also succeeds on a zombie (exited, parent has not reaped it yet).
  kill -0 "$1" 2>/dev/null || return 1
  [[ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]]
}

pid_running() {
  # The pid file's process is alive AND is our broker (guards against pid reuse).
  [[ -f "$PID_FILE" ]] || return 1
  local pid; pid="$(cat "$PID_FILE" 2>/dev/null || true)"
  [[ -n "$pid" ]] && alive "$pid" || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "kafka.Kafka $PROPS" || return 1
  echo "$pid"
}

check_java() {
  command -v java >/dev/null || die "java not found (Kafka 4 needs Java 17+)"
}

cmd_fetch() {
  if [[ -f "$LIBS/.complete" ]]; then
    log "Kafka $KAFKA_VERSION already cached in $LIBS"
    return 0
  fi
  command -v mvn >/dev/null || die "mvn not found (needed to fetch Kafka jars)"
  check_java
  log "fetching Kafka $KAFKA_VERSION and its runtime dependencies into $LIBS"
  local tmp="$KAFKA_HOME/libs.tmp.$$"
  rm -rf "$tmp"; mkdir -p "$tmp"
  local mvn_log="$KAFKA_HOME/fetch.log"
  mvn -q -B -f "$REPO/deploy/kafka-pom.xml" \
    "-Dkafka.version=$KAFKA_VERSION" \
    "$DEP_PLUGIN:copy-dependencies" \
    -DincludeScope=runtime "-DoutputDirectory=$tmp" >"$mvn_log" 2>&1 \
    || { tail -n 40 "$mvn_log" >&2; rm -rf "$tmp"
         die "mvn could not resolve kafka_2.13:$KAFKA_VERSION (log: $mvn_log)"; }
  ls "$tmp"/kafka_2.13-"$KAFKA_VERSION".jar >/dev/null || die "kafka_2.13 jar missing after fetch"
  rm -rf "$LIBS"; mv "$tmp" "$LIBS"
  touch "$LIBS/.complete"
  log "cached $(ls "$LIBS" | wc -l) jars ($(du -sh "$LIBS" | cut -f1))"
}

write_config() {
  mkdir -p "$DATA_DIR" "$LOG_DIR"
  # Rewritten on every start (ports/paths may change); storage is not touched.
  cat >"$PROPS" <<EOF
# Generated by deploy/kafka.sh: single combined broker+controller (KRaft) for tests.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$DATA_DIR

# One node: every replication factor / ISR is 1.
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1

# Tests create their topics explicitly; consumer groups join without delay.
auto.create.topics.enable=false
delete.topic.enable=true
group.initial.rebalance.delay.ms=0

# After a crash (SIGKILL) the restarted node cannot re-register until the old
# broker session expires: 4 s instead of the default 9 s keeps crash tests quick.
broker.session.timeout.ms=4000
broker.heartbeat.interval.ms=1000

# Small machine (2 cores).
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
background.threads=4

# Retention: a day or 1 GiB per partition, small segments.
log.retention.hours=24
log.retention.bytes=1073741824
log.segment.bytes=67108864
log.retention.check.interval.ms=60000
EOF
  cat >"$LOG4J" <<EOF
# Generated by deploy/kafka.sh: everything to $LOG_DIR/server.log (rolled at 50 MB).
status = warn
appender.file.type = RollingFile
appender.file.name = FILE
appender.file.fileName = $LOG_DIR/server.log
appender.file.filePattern = $LOG_DIR/server.log.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 50MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 3
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.state.name = state.change.logger
logger.state.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
EOF
}

# -XX:TieredStopAtLevel=1: the client compiler (C1) only. On a 2-core machine that
# also runs the services, C2's compilations compete with everything else for minutes
# after each start. bench/submit_bench.py, C2 and C1 runs interleaved, first round
# after a broker start: broker 2.25-2.60 ms of CPU per job and 313-359 submissions/s
# with C2, 0.70-0.72 ms and 628-664/s with C1; by the third round C2 is warm and the
# two are alike (0.81-0.89 against 0.66-0.84 ms; 531-554 against 520-620/s). The price:
# C1's code is slower per request, so once C2 is warm it gives lower latency
# (submit->placed at 200 jobs/s: p50 18-26 ms with C2, 28-33 ms with C1). Tests and
# demos run on a freshly started broker, so C1 is the default here.
# GPUSCHED_KAFKA_JVM_OPTS: more JVM options (split on spaces), after these ones.
read -r -a EXTRA_JVM_OPTS <<<"${GPUSCHED_KAFKA_JVM_OPTS:-}"
JAVA_OPTS=(-Xms128m "-Xmx$HEAP" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:TieredStopAtLevel=1
  "${EXTRA_JVM_OPTS[@]}"
  -Djava.awt.headless=true
  "-Dlog4j2.configurationFile=$LOG4J" "-Dkafka.logs.dir=$LOG_DIR"
  -cp "$LIBS/*")

java_cmd() { java "${JAVA_OPTS[@]}" "$@"; }  # $1 = main class, rest = its args

format_storage() {
  if [[ -f "$DATA_DIR/meta.properties" ]]; then
    return 0  # restart with existing data: never reformat
  fi
  local cluster_id
  cluster_id="$(java_cmd kafka.tools.StorageTool random-uuid 2>>"$LOG_DIR/storage-tool.log" | tail -n1)"
  [[ -n "$cluster_id" ]] || die "StorageTool random-uuid failed (see $LOG_DIR/storage-tool.log)"
  log "formatting $DATA_DIR (cluster id $cluster_id)"
  java_cmd kafka.tools.StorageTool format --cluster-id "$cluster_id" --config "$PROPS" \
    >>"$LOG_DIR/storage-tool.log" 2>&1 \
    || { tail -n 20 "$LOG_DIR/storage-tool.log" >&2; die "storage format failed"; }
}

cmd_start() {
  if [[ -n "${KAFKA_BOOTSTRAP_SERVERS:-}" ]]; then
    log "KAFKA_BOOTSTRAP_SERVERS is set; checking $KAFKA_BOOTSTRAP_SERVERS answers"
    wait_ready "$KAFKA_BOOTSTRAP_SERVERS" "$START_TIMEOUT" \
      || die "cluster at $KAFKA_BOOTSTRAP_SERVERS does not answer"
    echo "$KAFKA_BOOTSTRAP_SERVERS"
    return 0
  fi
  local pid
  if pid="$(pid_running)"; then
    wait_ready "$BOOTSTRAP" "$START_TIMEOUT" "$pid" \
      || die "broker pid $pid is running but not answering on $BOOTSTRAP (see $LOG_DIR/server.log)"
    log "already running (pid $pid)"
    echo "$BOOTSTRAP"
    return 0
  fi
  [[ -f "$LIBS/.complete" ]] || cmd_fetch
  check_java
  write_config
  format_storage
  local t0=$SECONDS
  log "starting broker on $BOOTSTRAP (controller 127.0.0.1:$CONTROLLER_PORT, data $DATA_DIR)"
  nohup java "${JAVA_OPTS[@]}" kafka.Kafka "$PROPS" >>"$LOG_DIR/kafka.out" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$PID_FILE"
  local rc=0
  wait_ready "$BOOTSTRAP" "$START_TIMEOUT" "$pid" || rc=$?
  if [[ $rc -ne 0 ]]; then
    [[ $rc -eq 2 ]] && log "broker process exited during startup" \
                    || log "broker did not answer within ${START_TIMEOUT}s"
    tail -n 30 "$LOG_DIR/kafka.out" "$LOG_DIR/server.log" >&2 2>/dev/null || true
    [[ $rc -eq 2 ]] || cmd_stop >/dev/null 2>&1 || true
    rm -f "$PID_FILE"
    exit 1
  fi
  log "broker up (pid $pid) after $((SECONDS - t0))s"
  echo "$BOOTSTRAP"
}

cmd_stop() {
  if [[ -n "${KAFKA_BOOTSTRAP_SERVERS:-}" ]]; then
    log "KAFKA_BOOTSTRAP_SERVERS is set; not stopping an external cluster"
    return 0
  fi
  local pid
  if ! pid="$(pid_running)"; then
    rm -f "$PID_FILE"
    log "not running"
    return 0
  fi
  log "stopping broker (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  local i
  for ((i = 0; i < 300; i++)); do   # 30 s for a controlled shutdown
    alive "$pid" || break
    sleep 0.1
  done
  if alive "$pid"; then
    log "still alive after 30 s; SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    while alive "$pid"; do sleep 0.1; done
  fi
  rm -f "$PID_FILE"
  log "stopped"
}

cmd_kill() {
  [[ -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ]] || die "KAFKA_BOOTSTRAP_SERVERS is set; not killing an external cluster"
  local pid
  if pid="$(pid_running)"; then
    log "killing broker (pid $pid) with SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    while alive "$pid"; do sleep 0.1; done
  else
    log "not running"
  fi
  rm -f "$PID_FILE"
}

cmd_status() {
  if [[ -n "${KAFKA_BOOTSTRAP_SERVERS:-}" ]]; then
    if wait_ready "$KAFKA_BOOTSTRAP_SERVERS" 5; then
      echo "running (external, $KAFKA_BOOTSTRAP_SERVERS)"; return 0
    fi
    echo "not running (external $KAFKA_BOOTSTRAP_SERVERS does not answer)"; return 3
  fi
  local pid
  if pid="$(pid_running)"; then
    echo "running (pid $pid, bootstrap $BOOTSTRAP, data $DATA_DIR)"
    return 0
  fi
  echo "not running"
  return 3
}

cmd_clean() {
  cmd_stop
  rm -rf "$RUN_DIR"
  log "removed $RUN_DIR"
}

case "${1:-}" in
  fetch) cmd_fetch ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  kill) cmd_kill ;;
  status) cmd_status ;;
  clean) cmd_clean ;;
  logs) tail -n "${2:-100}" "$LOG_DIR/server.log" ;;
  *) echo "usage: $0 fetch|start|stop|kill|status|clean|logs [N]" >&2; exit 2 ;;
esac
