#!/usr/bin/env bash
# The web UI benchmark: kiln's UI against MLflow's on the same data, in the system chromium.
#
#   bench/ui/run.sh [--bin PATH]      (or KILN_BIN=PATH; sizes and more: see bench/ui/bench.mjs)
#
# Needs, and does not build: a kiln binary (target/release/kiln when it is newer than the last
# commit touching services/, sdk/, proto/, else target/debug/kiln: `cargo build -p kiln-cli`),
# ui/dist (`npm --prefix ui ci && npm --prefix ui run build`) and /usr/bin/chromium. Installs:
# MLflow into target/mlflow-venv from bench/ui/requirements-mlflow.txt (every version pinned),
# and ui's pinned node modules (`npm --prefix ui ci`) if ui/node_modules is not there yet: the
# benchmark drives chromium with ui's playwright-core through ui/e2e's helpers.
# Prints a table and writes target/ui-bench.json.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"

while [ $# -gt 0 ]; do
  case "$1" in
    --bin) export KILN_BIN="$2"; shift 2 ;;
    -h|--help) sed -n '2,12p' bench/ui/run.sh; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

# The kiln binary: a release build only if it was built after the last change to the services.
if [ -z "${KILN_BIN:-}" ]; then
  changed=$(git log -1 --format=%ct -- services sdk proto 2>/dev/null || echo 0)
  if [ -x target/release/kiln ] && [ "$(stat -c %Y target/release/kiln)" -gt "${changed:-0}" ]; then
    KILN_BIN="$REPO/target/release/kiln"
  elif [ -x target/debug/kiln ]; then
    KILN_BIN="$REPO/target/debug/kiln"
  else
    echo "no kiln binary: cargo build -p kiln-cli (or pass --bin / KILN_BIN)" >&2
    exit 1
  fi
  export KILN_BIN
fi
[ -x "$KILN_BIN" ] || { echo "KILN_BIN=$KILN_BIN is not an executable" >&2; exit 1; }
[ -f ui/dist/index.html ] || { echo "no ui/dist: npm --prefix ui ci && npm --prefix ui run build" >&2; exit 1; }
[ -x "${KILN_CHROMIUM:-/usr/bin/chromium}" ] || { echo "no chromium at ${KILN_CHROMIUM:-/usr/bin/chromium} (apt-get install chromium)" >&2; exit 1; }

# MLflow, pinned, in its own venv; reinstalled when the requirements change.
VENV=target/mlflow-venv
REQS=bench/ui/requirements-mlflow.txt
STAMP="$VENV/.bench-ui-requirements"
if [ "${KILN_BENCH_MLFLOW:-1}" != 0 ] && ! cmp -s "$REQS" "$STAMP" 2>/dev/null; then
  echo "installing MLflow into $VENV" >&2
  "${PYTHON:-python3}" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQS"
  cp "$REQS" "$STAMP"
fi
export MLFLOW_PYTHON="$REPO/$VENV/bin/python"

# playwright-core (pinned in ui/package.json) for ui/e2e/browser.mjs.
if [ ! -f ui/node_modules/playwright-core/package.json ]; then
  npm --prefix ui ci
fi

echo "kiln: $KILN_BIN; load: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs" >&2
exec node bench/ui/bench.mjs
