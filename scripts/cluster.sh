#!/usr/bin/env bash
# Runs the production topology on this machine for a person: Postgres, three clustered
# nats-servers, Cassandra (standing in for ScyllaDB), versitygw (S3: scripts/s3-server.sh), and two replicas of every
# kiln service binary as separate processes (tests/topology), started with the config files,
# environment and ports deploy/compose/compose.yaml gives them (read through docker-compose).
#
#   scripts/cluster.sh up      start it in the background; prints `export KILN_ADDR=… KILN_TOKEN=…`
#                              for `eval "$(scripts/cluster.sh up)"`
#   scripts/cluster.sh down    stop it and everything it started
#   scripts/cluster.sh status  say whether it runs, and where its logs are
#
# The nats-servers admit only NKey users, one per service with the subjects of
# kiln_core::nats_auth (docs/security/nats.md). KILN_CLUSTER_TLS=1 makes it TLS-only too (client
# certificates on every gRPC listener, NATS with TLS); the exports then name the CA and a client
# certificate too.
# KILN_CLUSTER_DIR (default /tmp/kiln-cluster) holds configs, logs and data. Cassandra comes from
# KILN_TEST_SCYLLA_NODES and the S3 server from KILN_TEST_S3_* when set, else they are started
# here (scripts/cassandra, scripts/s3-server.sh). Run
# scripts/setup.sh --all once first: it installs nats-server and versitygw and builds the binaries.
# KILN_TOPOLOGY_BIN names another directory of service binaries (bench/batch_replicas.py runs the
# release builds). $KILN_CLUSTER_DIR/instances.json maps each instance (`item-batch-2`) to its
# gRPC URL, for what must reach one replica.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${KILN_CLUSTER_DIR:-/tmp/kiln-cluster}
KILN_TOOLS=${KILN_TOOLS:-${KILN_HOME:-$HOME/.kiln}/tools}
export PATH="$KILN_TOOLS/bin:$PATH"
export KILN_TEST_NATS_SERVER=${KILN_TEST_NATS_SERVER:-$KILN_TOOLS/bin/nats-server}
log() { printf 'cluster: %s\n' "$*" >&2; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

up() {
  if [ -f "$dir/topology.pid" ] && kill -0 "$(cat "$dir/topology.pid")" 2>/dev/null; then
    log "already running (pid $(cat "$dir/topology.pid")); scripts/cluster.sh down first"
    cat "$dir/exports"
    return 0
  fi
  local binary="$repo/target/debug/kiln-topology"
  [ -x "$binary" ] || { log "$binary is missing: run scripts/setup.sh --all"; exit 1; }
  # The harness reads deploy/compose/compose.yaml through docker-compose (installed if missing).
  KILN_TEST_COMPOSE=${KILN_TEST_COMPOSE:-$("$repo/scripts/compose-check.sh" --path)}
  export KILN_TEST_COMPOSE
  rm -rf "$dir"
  mkdir -p "$dir"
  if [ -z "${KILN_TEST_SCYLLA_NODES:-}" ]; then
    if ! compgen -G "$repo/scripts/cassandra/lib/cassandra-all-*.jar" >/dev/null; then
      log "fetching Apache Cassandra from Maven Central"
      mvn -B -q -f "$repo/scripts/cassandra/pom.xml" package
    fi
    local cass_port
    cass_port=$(free_port)
    log "starting Cassandra on 127.0.0.1:$cass_port"
    CASSANDRA_RUN_DIR="$dir/cassandra" CASSANDRA_NATIVE_PORT="$cass_port" CASSANDRA_STORAGE_PORT="$(free_port)" \
      CASSANDRA_CLEAN=1 "$repo/scripts/cassandra/start.sh" >/dev/null
    export KILN_TEST_SCYLLA_NODES="127.0.0.1:$cass_port"
    touch "$dir/cassandra.ours"
  fi
  if [ -z "${KILN_TEST_S3_ENDPOINT:-}" ]; then
    log "starting versitygw"
    "$repo/scripts/s3-server.sh" start "$dir/s3"
    # shellcheck disable=SC1091
    source "$dir/s3/env"
    touch "$dir/s3.ours"
  fi
  log "starting the topology (logs in $dir/logs)"
  local tls=()
  [ "${KILN_CLUSTER_TLS:-0}" = 1 ] && tls=(--tls)
  nohup "$binary" --dir "$dir/topology" --exports-file "$dir/exports" "${tls[@]}" >"$dir/topology.log" 2>&1 &
  echo $! >"$dir/topology.pid"
  for _ in $(seq 1 600); do
    [ -s "$dir/exports" ] && break
    if ! kill -0 "$(cat "$dir/topology.pid")" 2>/dev/null; then
      tail -n 40 "$dir/topology.log" >&2
      log "the topology did not start"
      exit 1
    fi
    sleep 0.2
  done
  [ -s "$dir/exports" ] || { log "the topology did not start within 2 minutes"; exit 1; }
  log "running: api, scheduler, runner, log-ingest, item-batch x2, a sim runner; NATS x3; Postgres; S3; Cassandra"
  cat "$dir/exports"
}

down() {
  if [ -f "$dir/topology.pid" ]; then
    local pid
    pid=$(cat "$dir/topology.pid")
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid"
      for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$dir/topology.pid"
  fi
  if [ -f "$dir/s3.ours" ]; then
    "$repo/scripts/s3-server.sh" stop "$dir/s3"
    rm -f "$dir/s3.ours"
  fi
  if [ -f "$dir/cassandra.ours" ]; then
    CASSANDRA_RUN_DIR="$dir/cassandra" "$repo/scripts/cassandra/stop.sh" --kill --clean >/dev/null 2>&1 || true
    rm -f "$dir/cassandra.ours"
  fi
  log "stopped"
}

status() {
  if [ -f "$dir/topology.pid" ] && kill -0 "$(cat "$dir/topology.pid")" 2>/dev/null; then
    log "running (pid $(cat "$dir/topology.pid")); logs in $dir/topology/logs"
    cat "$dir/exports"
  else
    log "not running"
    return 1
  fi
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
