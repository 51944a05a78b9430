#!/usr/bin/env bash
# Runs the benchmarks in release builds and prints their figures side by side with the peer's:
#   submit-latency — submit-to-running of a container job, kiln against the raw Docker Engine
# Uses the Docker Engine at DOCKER_HOST (or the local socket) when it answers, else starts one
# like scripts/test.sh does, and the locally built busybox test image.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$repo/scripts/setup.sh"
KILN_TOOLS=${KILN_TOOLS:-${KILN_HOME:-$HOME/.kiln}/tools}
export PATH="$KILN_TOOLS/bin:$HOME/.cargo/bin:$PATH"

docker_host=${DOCKER_HOST:-unix:///var/run/docker.sock}
docker_dir=""
cleanup() {
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
cargo build --release --locked -p kiln-cli -p kiln-bench
./target/release/submit-latency --kiln ./target/release/kiln --docker-host "$docker_host" --image "$image" --runs "${RUNS:-20}"
