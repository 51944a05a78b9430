#!/usr/bin/env bash
# Runs the benchmarks in release builds and prints their figures side by side with the peer's:
#   submit-latency — submit-to-running of a container job, kiln against the raw Docker Engine
#   metrics_throughput.py — metric points per second, kiln (SQLite and ScyllaDB stores) against
#     the MLflow tracking server (mlflow==3.17.2 from PyPI, SQLite backend), 1 and 4 clients
#   sched-sim — the scheduling study: 10,000 jobs from 100 users on 1,000 simulated instances
#     (fairness, utilisation, waits, spot savings, the time of one pass)
#   registry-search + registry_search.py — the model registry's searches at 10,000 versions,
#     kiln (SQLite) against MLflow's registry (mlflow==3.17.2, SQLite backend, in process)
#   item-log-search — a batch's item lines searched at 1,000,000 lines (SQLite), beside GNU grep
#     over the same lines in a flat file
#   batch_throughput.py — batch items per second with 2 workers and no-op items, kiln against
#     Celery (celery==5.7.0, redis==8.1.0, Debian's redis-server) and a raw JetStream work queue
#     (nats-py==2.16.0)
#   batch_replicas.py — the same batch added through one item-batch replica and through two, on
#     the topology (scripts/cluster.sh: Postgres, three nats-servers, Cassandra, two of each
#     service), release builds
#   provisioner-bench — the provisioner scaling 0 → 1,000 simulated instances and back (cycles, calls,
#     CPU, cost against the greedy lower bound, demand → create call), beside Karpenter's published
#     figures
#   outputs-sync-bench — the runner's incremental outputs sync of a 2 GiB directory (everything,
#     nothing changed, one file rewritten) against `aws s3 sync` (awscli==1.42.76), both to
#     versitygw
#   change_feed.py — what 10 open Runs pages over 10,000 runs cost kiln up (bytes sent, CPU):
#     polling ListJobs every 2 s against the change feed (WatchJobs as server-sent events)
#   sweep-bench — sweeps against Optuna (optuna==5.0.0, scikit-learn==1.9.1, numpy==2.4.6): search
#     quality of TPE, ASHA's early stopping on learning curves, the advisor's overhead per trial
# Uses the Docker Engine at DOCKER_HOST (or the local socket) when it answers, else starts one
# like scripts/test.sh does, and the locally built busybox test image.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$repo/scripts/setup.sh" --all
KILN_TOOLS=${KILN_TOOLS:-${KILN_HOME:-$HOME/.kiln}/tools}
export PATH="$KILN_TOOLS/bin:$HOME/.cargo/bin:$PATH"

docker_host=${DOCKER_HOST:-unix:///var/run/docker.sock}
docker_dir=""
cass_dir=""
s3_dir=""
cleanup() {
  if [ -n "$s3_dir" ]; then "$repo/scripts/s3-server.sh" stop "$s3_dir" || true; rm -rf "$s3_dir"; fi
  if [ -n "$cass_dir" ]; then CASSANDRA_RUN_DIR="$cass_dir" "$repo/scripts/cassandra/stop.sh" --kill --clean >/dev/null 2>&1 || true; fi
  if [ -n "$docker_dir" ] && [ -f "$docker_dir/docker.pid" ]; then kill "$(cat "$docker_dir/docker.pid")" 2>/dev/null || true; fi
}
trap cleanup EXIT
if ! DOCKER_HOST="$docker_host" docker info >/dev/null 2>&1; then
  docker_root=${KILN_TEST_DOCKER_ROOT:-/var/lib/kiln-test-docker}
  docker_dir=$(mktemp -d /tmp/kiln-bench-docker.XXXXXX)
  docker_host="unix://$docker_dir/docker.sock"
  mkdir -p "$docker_root"
  dockerd --host "$docker_host" --data-root "$docker_root" --exec-root "$docker_dir/exec" \
    --pidfile "$docker_dir/docker.pid" >"$docker_dir/dockerd.log" 2>&1 &
  for _ in $(seq 1 100); do DOCKER_HOST="$docker_host" docker info >/dev/null 2>&1 && break; sleep 0.2; done
fi
image=$(DOCKER_HOST="$docker_host" "$repo/scripts/test-image.sh")

cd "$repo"
cargo build --release --locked -p kiln-cli -p kiln-bench -p kiln-agent
./target/release/submit-latency --kiln ./target/release/kiln --docker-host "$docker_host" --image "$image" --runs "${RUNS:-20}"

# --- metric throughput against MLflow ------------------------------------------------------------
venv="$repo/target/bench-venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "$repo/sdk/python" "mlflow==3.17.2"
compgen -G "$repo/scripts/cassandra/lib/cassandra-all-*.jar" >/dev/null || mvn -B -q -f "$repo/scripts/cassandra/pom.xml" package
cass_dir=$(mktemp -d /tmp/kiln-bench-cassandra.XXXXXX)
cass_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
CASSANDRA_RUN_DIR="$cass_dir" CASSANDRA_NATIVE_PORT="$cass_port" CASSANDRA_STORAGE_PORT=$((cass_port + 1)) \
  CASSANDRA_CLEAN=1 "$repo/scripts/cassandra/start.sh" >/dev/null
(cd "$repo/bench" && "$venv/bin/python" metrics_throughput.py --kiln "$repo/target/release/kiln" \
  --mlflow "$venv/bin/mlflow" --mlflow-python "$venv/bin/python" --cassandra "127.0.0.1:$cass_port")

# --- batch throughput against Celery + Redis and raw JetStream -----------------------------------
"$venv/bin/pip" install -q --disable-pip-version-check "celery==5.7.0" "redis==8.1.0" "nats-py==2.16.0" "packaging==26.4"
if ! command -v redis-server >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || { echo "bench: redis-server is missing; install it as root: apt-get install -y redis-server" >&2; exit 1; }
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server
fi
"$venv/bin/python" "$repo/bench/batch_throughput.py" --kiln "$repo/target/release/kiln" --python "$venv/bin/python"

# --- item-batch replicas on the topology (scripts/cluster.sh): one replica against two -----------
# The services' release builds (a feature set of their own: a build of its own) and the harness.
cargo build --release --locked -p kiln-api -p kiln-scheduler -p kiln-runner -p kiln-log-ingest \
  -p kiln-item-batch -p kiln-advisor -p kiln-predictor -p kiln-agent
cargo build --locked -p kiln-topology
"$venv/bin/python" "$repo/bench/batch_replicas.py" --kiln "$repo/target/release/kiln"

# --- the scheduling study -------------------------------------------------------------------------
./target/release/sched-sim --seed 1

# --- the provisioner at 1,000 simulated instances ------------------------------------------------
./target/release/provisioner-bench --instances 1000

# --- the outputs sync against aws s3 sync, both to versitygw --------------------------------------
s3_dir=$(mktemp -d /tmp/kiln-bench-s3.XXXXXX)
"$repo/scripts/s3-server.sh" start "$s3_dir"
# shellcheck disable=SC1091
source "$s3_dir/env"
"$venv/bin/pip" install -q --disable-pip-version-check "awscli==1.42.76"
./target/release/outputs-sync-bench --mib "${SYNC_MIB:-2048}" --aws "$venv/bin/aws"

# --- open Runs pages: polling ListJobs against the change feed ----------------------------------
"$venv/bin/python" "$repo/bench/change_feed.py" --kiln "$repo/target/release/kiln"

# --- sweeps against Optuna: search quality, early stopping, advisor overhead --------------------
"$venv/bin/pip" install -q --disable-pip-version-check "optuna==5.0.0" "scikit-learn==1.9.1" "numpy==2.4.6"
./target/release/sweep-bench --python "$venv/bin/python"

# --- model registry search against MLflow's registry ---------------------------------------------
./target/release/registry-search
"$venv/bin/python" "$repo/bench/registry_search.py"

# --- a batch's item lines searched at 1,000,000 lines --------------------------------------------
./target/release/item-log-search
