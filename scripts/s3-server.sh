#!/usr/bin/env bash
# Starts or stops versitygw (installed by scripts/setup.sh --all), an S3-compatible server, on a free
# loopback port with its posix backend in DIR and one bucket; scripts/test.sh and
# scripts/cluster.sh both use it.
#
#   scripts/s3-server.sh start DIR   start it; writes DIR/env, the `export KILN_TEST_S3_*` lines
#                                    (ENDPOINT, BUCKET, ACCESS_KEY_ID, SECRET_ACCESS_KEY)
#   scripts/s3-server.sh stop DIR    stop it
#
# Only on loopback; the root credentials go to it through its environment, not its command line.
set -euo pipefail

KILN_TOOLS=${KILN_TOOLS:-${KILN_HOME:-$HOME/.kiln}/tools}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start() {
  local dir=$1 port endpoint secret
  mkdir -p "$dir/root"
  port=$(free_port)
  endpoint="http://127.0.0.1:$port"
  secret=$(python3 -c 'import secrets; print(secrets.token_hex(20))')
  ROOT_ACCESS_KEY_ID=kiln-test ROOT_SECRET_ACCESS_KEY="$secret" \
    "$KILN_TOOLS/bin/versitygw" --port "127.0.0.1:$port" --health /health --quiet \
    posix "$dir/root" >"$dir/versitygw.log" 2>&1 &
  echo $! >"$dir/versitygw.pid"
  for _ in $(seq 1 100); do
    curl -fs "$endpoint/health" >/dev/null 2>&1 && break
    sleep 0.1
  done
  # CreateBucket, signed with SigV4 by curl; the payload hash is that of the empty body.
  curl -fsS -X PUT --aws-sigv4 "aws:amz:us-east-1:s3" --user "kiln-test:$secret" \
    -H "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" \
    "$endpoint/kiln-test" >/dev/null ||
    { cat "$dir/versitygw.log" >&2; echo "s3-server: versitygw did not start" >&2; exit 1; }
  umask 077
  cat >"$dir/env" <<ENV
export KILN_TEST_S3_ENDPOINT=$endpoint
export KILN_TEST_S3_BUCKET=kiln-test
export KILN_TEST_S3_ACCESS_KEY_ID=kiln-test
export KILN_TEST_S3_SECRET_ACCESS_KEY=$secret
ENV
}

stop() {
  local dir=$1
  [ ! -f "$dir/versitygw.pid" ] || kill "$(cat "$dir/versitygw.pid")" 2>/dev/null || true
}

case "${1:-}" in
  start) start "$2" ;;
  stop) stop "$2" ;;
  *) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac
