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
#   GPUSCHED_KAFKA_SECURITY      plaintext (default) or sasl_ssl: clients speak SASL_SSL
#                                with SCRAM-SHA-512 (or -256), a throwaway CA and broker cert are
#                                made in <run>/kafka/secrets at format time, with one
#                                SCRAM user per principal (principals() below) and
#                                their passwords in <run>/kafka/secrets/credentials;
#                                the StandardAuthorizer denies what no ACL allows
#                                (docs/reference/kafka-security.md). The controller listener is
#                                mutual TLS with the broker certificate.
#   GPUSCHED_KAFKA_BROKERS       combined broker+controller nodes (default 1); node i
#                                listens on port+2(i-1) (controller one above); node 1
#                                keeps the single-node paths, node i>1 lives in
#                                <run>/kafka/node-i. `kill [i]` / `stop [i]` take a node.
#   GPUSCHED_KAFKA_HOSTS         per-node listen addresses, space separated (default
#                                127.0.0.1 for every node; a shorter list repeats its
#                                last entry): node i listens, advertises and votes on
#                                the i-th address; the printed bootstrap lists them
#   GPUSCHED_KAFKA_NETNS         per-node network namespaces, space separated ("-" or
#                                a missing entry: none): node i's java runs under
#                                `ip netns exec NS` (a test rig's hosts, tests/rig/)
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
BASE_PORT="${GPUSCHED_KAFKA_PORT:-19092}"
RUN_ROOT="${GPUSCHED_RUN_DIR:-$REPO/.run}"
RUN_DIR="$RUN_ROOT/kafka"
SECRETS="$RUN_DIR/secrets"
SECURITY="${GPUSCHED_KAFKA_SECURITY:-plaintext}"
NODES="${GPUSCHED_KAFKA_BROKERS:-1}"
HEAP="${GPUSCHED_KAFKA_HEAP:-768m}"
START_TIMEOUT="${GPUSCHED_KAFKA_START_TIMEOUT:-90}"
[[ "$SECURITY" == plaintext || "$SECURITY" == sasl_ssl ]] \
  || { echo "kafka.sh: GPUSCHED_KAFKA_SECURITY must be plaintext or sasl_ssl, not $SECURITY" >&2; exit 2; }
[[ "$NODES" =~ ^[1-9]$ ]] || { echo "kafka.sh: GPUSCHED_KAFKA_BROKERS must be 1-9, not $NODES" >&2; exit 2; }
read -r -a HOSTS <<<"${GPUSCHED_KAFKA_HOSTS:-127.0.0.1}"
((${#HOSTS[@]})) || HOSTS=(127.0.0.1)
read -r -a NETNSES <<<"${GPUSCHED_KAFKA_NETNS:-}"
host_of() {  # host_of NODE: its listen address
  local i=$(($1 - 1))
  ((i < ${#HOSTS[@]})) || i=$((${#HOSTS[@]} - 1))
  echo "${HOSTS[$i]}"
}

# node NODE: set the per-node paths and ports (node 1 keeps the single-node layout).
node() {
  NODE="$1"
  PORT="$((BASE_PORT + 2 * (NODE - 1)))"
  CONTROLLER_PORT="$((PORT + 1))"
  HOST="$(host_of "$NODE")"
  NETNS="${NETNSES[$((NODE - 1))]:-}"
  [[ "$NETNS" != - ]] || NETNS=""
  if [[ "$NODE" == 1 ]]; then NODE_DIR="$RUN_DIR"; else NODE_DIR="$RUN_DIR/node-$NODE"; fi
  DATA_DIR="$NODE_DIR/data"
  LOG_DIR="$NODE_DIR/logs"
  PROPS="$NODE_DIR/server.properties"
  LOG4J="$NODE_DIR/log4j2.properties"
  PID_FILE="$NODE_DIR/kafka.pid"
}
node 1
BOOTSTRAP=""
for ((i = 1; i <= NODES; i++)); do BOOTSTRAP+="${BOOTSTRAP:+,}$(host_of "$i"):$((BASE_PORT + 2 * (i - 1)))"; done
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

# wait_ready BOOTSTRAP TIMEOUT ["PID ..."]: succeed once the cluster answers a metadata
# request listing GPUSCHED_READY_BROKERS (default 1) unfenced brokers; fail early if a
# PID dies. KAFKA_SH_CA/KAFKA_SH_PASSWORD: log in as the admin over SASL_SSL.
wait_ready() {
  "$(python_bin)" - "$1" "$2" "${3:-}" <<'PY'
import asyncio, os, socket, struct, sys, time

bootstrap, timeout, pids = sys.argv[1], float(sys.argv[2]), sys.argv[3].split()
deadline = time.monotonic() + timeout
want = int(os.environ.get("GPUSCHED_READY_BROKERS") or 1)

def alive():
    for pid in pids:
        try:  # a zombie (state Z) counts as dead
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return False
        except OSError:
            return False
    return True

def security():
    if not os.environ.get("KAFKA_SH_CA"):
        return {}
    from aiokafka.helpers import create_ssl_context
    return dict(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                sasl_plain_username="admin", sasl_plain_password=os.environ["KAFKA_SH_PASSWORD"],
                ssl_context=create_ssl_context(cafile=os.environ["KAFKA_SH_CA"]))

async def probe_aiokafka():
    from aiokafka.admin import AIOKafkaAdminClient
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000, **security())
    try:
        await admin.start()
        meta = await admin.describe_cluster()
        # KRaft brokers leave fenced brokers out of metadata, so a listed broker is
        # registered and can host partitions.
        return len(meta.get("brokers") or ()) >= want
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

voters() {
  local i v=""
  for ((i = 1; i <= NODES; i++)); do v+="${v:+,}$i@$(host_of "$i"):$((BASE_PORT + 2 * (i - 1) + 1))"; done
  echo "$v"
}

# Replication settings follow the node count: 3 nodes -> 3 copies, 2 must be in sync.
replicas() { if ((NODES >= 3)); then echo 3; else echo "$NODES"; fi; }
min_isr() { local r; r="$(replicas)"; if ((r >= 3)); then echo 2; else echo 1; fi; }

listener_config() {
  if [[ "$SECURITY" == plaintext ]]; then
    cat <<EOF
listeners=PLAINTEXT://$HOST:$PORT,CONTROLLER://$HOST:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://$HOST:$PORT
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
EOF
    return
  fi
  local admin_pw; admin_pw="$(password_of admin)"
  # Clients: SASL_SSL with SCRAM-SHA-512 (SCRAM-SHA-256 too: a user's credentials of the
  # two mechanisms are apart, which rotates a login without downtime, docs/guide/deploying.md);
  # brokers talk to each other on it as the admin user. The controller listener is mutual
  # TLS: SCRAM users live in the metadata log that controllers serve, so they cannot
  # authenticate the controllers themselves.
  cat <<EOF
listeners=SASL_SSL://$HOST:$PORT,CONTROLLER://$HOST:$CONTROLLER_PORT
advertised.listeners=SASL_SSL://$HOST:$PORT
inter.broker.listener.name=SASL_SSL
listener.security.protocol.map=CONTROLLER:SSL,SASL_SSL:SASL_SSL
sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$admin_pw";
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.controller.ssl.client.auth=required
ssl.keystore.type=PEM
ssl.keystore.location=$SECRETS/broker.pem
ssl.truststore.type=PEM
ssl.truststore.location=$SECRETS/ca.pem
ssl.endpoint.identification.algorithm=https
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:admin;User:CN=gpusched-broker
EOF
}

write_config() {
  mkdir -p "$DATA_DIR" "$LOG_DIR"
  local rf isr; rf="$(replicas)"; isr="$(min_isr)"
  # Rewritten on every start (ports/paths may change); storage is not touched. Readable
  # by its owner only: on a secured broker it holds the admin's password.
  touch "$PROPS" && chmod 600 "$PROPS"
  cat >"$PROPS" <<EOF
# Generated by deploy/kafka.sh: combined broker+controller node $NODE of $NODES (KRaft).
process.roles=broker,controller
node.id=$NODE
controller.quorum.voters=$(voters)
controller.listener.names=CONTROLLER
$(listener_config)
log.dirs=$DATA_DIR

# Internal topics and defaults follow the node count (3 nodes: 3 copies, 2 in sync).
num.partitions=1
default.replication.factor=$rf
min.insync.replicas=$isr
offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$isr

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
java_cmd() {  # $1 = main class (or @FILE: a Java argument file holding it), rest = its args; logs go to the current node's dir
  java -Xms128m "-Xmx$HEAP" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:TieredStopAtLevel=1 \
    "${EXTRA_JVM_OPTS[@]}" -Djava.awt.headless=true \
    "-Dlog4j2.configurationFile=$LOG4J" "-Dkafka.logs.dir=$LOG_DIR" -cp "$LIBS/*" "$@"
}

# The SCRAM users: one per service, the admin (super user: creates topics and ACLs) and
# "nobody" (a valid login with no role: tests check it is refused everything). The list
# is the package's (gpusched/adapters/broker/kafka_principals.py, standard library only), read
# from this checkout, so any python3 will do; set by cmd_start on a secured start.
PRINCIPALS=""
principals() {
  local names
  names="$(PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "$(python_bin)" -m gpusched.adapters.broker.kafka_principals)" \
    && [[ -n "$names" ]] \
    || die "could not list the Kafka principals (python -m gpusched.adapters.broker.kafka_principals in $REPO)"
  echo "$names"
}

password_of() { awk -v u="$1" '$1 == u {print $2}' "$SECRETS/credentials"; }

make_secrets() {
  # A throwaway CA and broker certificate (IP SAN 127.0.0.1), and random passwords;
  # made once per run dir, kept with its data.
  [[ -f "$SECRETS/credentials" ]] && return 0
  command -v openssl >/dev/null || die "openssl not found (needed for GPUSCHED_KAFKA_SECURITY=sasl_ssl)"
  mkdir -p "$SECRETS"; chmod 700 "$SECRETS"
  local d="$SECRETS" u
  (
    umask 077
    openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=gpusched-test-ca" \
      -keyout "$d/ca.key" -out "$d/ca.pem" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=gpusched-broker" \
      -keyout "$d/broker.key" -out "$d/broker.csr" 2>/dev/null
    local san="IP:127.0.0.1,DNS:localhost" h
    for h in "${HOSTS[@]}"; do [[ "$h" == 127.0.0.1 ]] || san+=",IP:$h"; done
    printf 'subjectAltName=%s\n' "$san" >"$d/san.ext"
    openssl x509 -req -in "$d/broker.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
      -days 30 -extfile "$d/san.ext" -out "$d/broker.crt" 2>/dev/null
    # Kafka's PEM keystore: an unencrypted PKCS#8 key followed by the chain.
    openssl pkcs8 -topk8 -nocrypt -in "$d/broker.key" >"$d/broker.pem"
    cat "$d/broker.crt" "$d/ca.pem" >>"$d/broker.pem"
    for u in $PRINCIPALS; do echo "$u $(openssl rand -hex 16)"; done >"$d/credentials.tmp"
    mv "$d/credentials.tmp" "$d/credentials"
  ) || die "could not make the CA, certificate or passwords in $SECRETS"
  log "made a throwaway CA, broker certificate and SCRAM passwords in $SECRETS"
}

cluster_id() {
  if [[ ! -s "$RUN_DIR/cluster-id" ]]; then
    mkdir -p "$RUN_DIR" "$LOG_DIR"
    java_cmd kafka.tools.StorageTool random-uuid 2>>"$LOG_DIR/storage-tool.log" | tail -n1 >"$RUN_DIR/cluster-id"
  fi
  [[ -s "$RUN_DIR/cluster-id" ]] || die "StorageTool random-uuid failed (see $LOG_DIR/storage-tool.log)"
  cat "$RUN_DIR/cluster-id"
}

format_storage() {
  if [[ -f "$DATA_DIR/meta.properties" ]]; then
    return 0  # restart with existing data: never reformat
  fi
  local id u args
  id="$(cluster_id)"
  # The SCRAM users go in with the format. Their passwords must not be on a command line,
  # which every local user reads (ps, /proc/PID/cmdline): the tool's main class and
  # arguments are in a Java argument file (java @FILE), mode 600, removed afterwards.
  args="$NODE_DIR/format.args"
  (
    umask 077
    {
      printf '%s\n' kafka.tools.StorageTool format --cluster-id "\"$id\"" --config "\"$PROPS\""
      if [[ "$SECURITY" == sasl_ssl ]]; then
        for u in $PRINCIPALS; do printf '%s\n' --add-scram "SCRAM-SHA-512=[name=$u,password=$(password_of "$u")]"; done
      fi
    } >"$args"
  )
  log "formatting $DATA_DIR (cluster id $id)"
  local rc=0
  java_cmd "@$args" >>"$LOG_DIR/storage-tool.log" 2>&1 || rc=$?
  rm -f "$args"
  [[ $rc -eq 0 ]] || { tail -n 20 "$LOG_DIR/storage-tool.log" >&2; die "storage format failed"; }
}

ready_env() {  # the probe logs in as the admin on a secured cluster
  [[ "$SECURITY" == sasl_ssl && -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ]] || return 0
  export KAFKA_SH_CA="$SECRETS/ca.pem" KAFKA_SH_PASSWORD="$(password_of admin)"
}

start_node() {  # start node $NODE unless it runs; echo its pid
  local pid
  if pid="$(pid_running)"; then echo "$pid"; return 0; fi
  write_config
  format_storage
  log "starting node $NODE on $HOST:$PORT (controller $CONTROLLER_PORT, data $DATA_DIR, $SECURITY${NETNS:+, netns $NETNS})"
  local prefix=()
  [[ -z "$NETNS" ]] || prefix=(ip netns exec "$NETNS")
  nohup "${prefix[@]}" java -Xms128m "-Xmx$HEAP" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:TieredStopAtLevel=1 \
    "${EXTRA_JVM_OPTS[@]}" -Djava.awt.headless=true \
    "-Dlog4j2.configurationFile=$LOG4J" "-Dkafka.logs.dir=$LOG_DIR" -cp "$LIBS/*" \
    kafka.Kafka "$PROPS" >>"$LOG_DIR/kafka.out" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$PID_FILE"
  echo "$pid"
}

cmd_start() {
  if [[ -n "${KAFKA_BOOTSTRAP_SERVERS:-}" ]]; then
    log "KAFKA_BOOTSTRAP_SERVERS is set; checking $KAFKA_BOOTSTRAP_SERVERS answers"
    wait_ready "$KAFKA_BOOTSTRAP_SERVERS" "$START_TIMEOUT" \
      || die "cluster at $KAFKA_BOOTSTRAP_SERVERS does not answer"
    echo "$KAFKA_BOOTSTRAP_SERVERS"
    return 0
  fi
  [[ -f "$LIBS/.complete" ]] || cmd_fetch
  check_java
  # SCRAM users are written at format time: a run dir formatted in the other mode
  # would start a broker nobody can log in to.
  if [[ -s "$RUN_DIR/security" && "$(cat "$RUN_DIR/security")" != "$SECURITY" ]]; then
    die "$RUN_DIR was formatted with GPUSCHED_KAFKA_SECURITY=$(cat "$RUN_DIR/security"); use that or \`clean\` first"
  fi
  mkdir -p "$RUN_DIR"; echo "$SECURITY" >"$RUN_DIR/security"
  if [[ "$SECURITY" == sasl_ssl ]]; then PRINCIPALS="$(principals)"; make_secrets; fi
  ready_env
  local t0=$SECONDS i pids=()
  for ((i = 1; i <= NODES; i++)); do node "$i"; pids+=("$(start_node)"); done
  node 1
  # A quorum needs a majority, so the nodes start together and are awaited together:
  # ready once every node is registered (a single node: once it answers).
  local rc=0
  GPUSCHED_READY_BROKERS="$NODES" wait_ready "$BOOTSTRAP" "$START_TIMEOUT" "${pids[*]}" || rc=$?
  if [[ $rc -ne 0 ]]; then
    [[ $rc -eq 2 ]] && log "a node exited during startup" \
                    || log "cluster did not answer within ${START_TIMEOUT}s"
    for ((i = 1; i <= NODES; i++)); do
      node "$i"; tail -n 30 "$LOG_DIR/kafka.out" "$LOG_DIR/server.log" >&2 2>/dev/null || true
    done
    [[ $rc -eq 2 ]] || cmd_stop >/dev/null 2>&1 || true
    exit 1
  fi
  log "cluster up ($NODES node(s), pids ${pids[*]}) after $((SECONDS - t0))s"
  echo "$BOOTSTRAP"
}

stop_node() {
  local pid
  if ! pid="$(pid_running)"; then rm -f "$PID_FILE"; return 0; fi
  log "stopping node $NODE (pid $pid)"
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
}

kill_node() {
  local pid
  if pid="$(pid_running)"; then
    log "killing node $NODE (pid $pid) with SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    while alive "$pid"; do sleep 0.1; done
  fi
  rm -f "$PID_FILE"
}

# each_node ACTION [NODE]: ACTION on one node, or on all (the last node first, so that
# a controlled shutdown of all does not wait on leadership moves to stopping nodes).
each_node() {
  local action="$1" i
  if [[ -n "${2:-}" ]]; then node "$2"; "$action"; return; fi
  for ((i = NODES; i >= 1; i--)); do node "$i"; "$action"; done
}

cmd_stop() {
  if [[ -n "${KAFKA_BOOTSTRAP_SERVERS:-}" ]]; then
    log "KAFKA_BOOTSTRAP_SERVERS is set; not stopping an external cluster"
    return 0
  fi
  each_node stop_node "${1:-}"
  log "stopped"
}

cmd_kill() {
  [[ -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ]] || die "KAFKA_BOOTSTRAP_SERVERS is set; not killing an external cluster"
  each_node kill_node "${1:-}"
}

cmd_status() {
  if [[ -n "${KAFKA_BOOTSTRAP_SERVERS:-}" ]]; then
    if wait_ready "$KAFKA_BOOTSTRAP_SERVERS" 5; then
      echo "running (external, $KAFKA_BOOTSTRAP_SERVERS)"; return 0
    fi
    echo "not running (external $KAFKA_BOOTSTRAP_SERVERS does not answer)"; return 3
  fi
  local i pid up=()
  for ((i = 1; i <= NODES; i++)); do node "$i"; pid="$(pid_running)" && up+=("$i:$pid"); done
  node 1
  if ((${#up[@]})); then
    echo "running (node:pid ${up[*]}, bootstrap $BOOTSTRAP, $SECURITY, data $RUN_DIR)"
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
  stop) cmd_stop "${2:-}" ;;
  kill) cmd_kill "${2:-}" ;;
  status) cmd_status ;;
  clean) cmd_clean ;;
  logs) node "${3:-1}"; tail -n "${2:-100}" "$LOG_DIR/server.log" ;;
  *) echo "usage: $0 fetch|start|stop [NODE]|kill [NODE]|status|clean|logs [N [NODE]]" >&2; exit 2 ;;
esac
