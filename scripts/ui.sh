#!/usr/bin/env bash
# The web UI (ui/, Vite + Svelte + uPlot; every npm package pinned by ui/package-lock.json):
#   scripts/ui.sh build   npm ci, then `vite build` into ui/dist, installed as $KILN_TOOLS/ui
#                         (a copy), where `kiln up` finds it without --ui-dir
#   scripts/ui.sh check   svelte-check (types, accessibility) and the vitest unit tests
#   scripts/ui.sh e2e     the browser tests: a real `kiln up` ($KILN_BIN, default
#                         target/debug/kiln) per test, driven with playwright-core in Debian's
#                         chromium ($KILN_CHROMIUM, default /usr/bin/chromium; never a browser
#                         download); screenshots of every page in ui/e2e/artifacts/ (CI artifacts)
# Needs Node.js 20 and npm (scripts/setup.sh installs them, and chromium).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KILN_TOOLS=${KILN_TOOLS:-${KILN_HOME:-$HOME/.kiln}/tools}
log() { printf '\033[1mui:\033[0m %s\n' "$*" >&2; }
command -v npm >/dev/null || { echo "ui: npm not found: apt-get install nodejs npm (setup.sh)" >&2; exit 1; }

cd "$repo/ui"
deps() {
  # npm ci is skipped when node_modules was installed from this lock file: a copy of it is kept
  # there after each install (npm's own node_modules/.package-lock.json is another format, so
  # comparing with it reinstalled every time, and under a concurrent run's feet).
  if ! cmp -s package-lock.json node_modules/.kiln-installed-lock.json 2>/dev/null; then
    npm ci --no-audit --no-fund --loglevel=error
    cp package-lock.json node_modules/.kiln-installed-lock.json
  fi
}

case "${1:-}" in
  build)
    deps
    npm run --silent build
    rm -rf "$KILN_TOOLS/ui.new" && mkdir -p "$KILN_TOOLS"
    cp -r dist "$KILN_TOOLS/ui.new"
    rm -rf "$KILN_TOOLS/ui" && mv "$KILN_TOOLS/ui.new" "$KILN_TOOLS/ui"
    log "built ui/dist, installed as $KILN_TOOLS/ui"
    ;;
  check)
    deps
    npm run --silent check
    npm test --silent
    ;;
  e2e)
    deps
    [ -f dist/index.html ] || npm run --silent build
    export KILN_BIN=${KILN_BIN:-$repo/target/debug/kiln}
    export KILN_CHROMIUM=${KILN_CHROMIUM:-/usr/bin/chromium}
    [ -x "$KILN_BIN" ] || { echo "ui: $KILN_BIN is missing: cargo build -p kiln-cli" >&2; exit 1; }
    [ -x "$KILN_CHROMIUM" ] || { echo "ui: $KILN_CHROMIUM is missing: apt-get install chromium (setup.sh --all)" >&2; exit 1; }
    log "$("$KILN_CHROMIUM" --version 2>/dev/null | head -n 1)"
    rm -rf e2e/artifacts
    node --test --test-concurrency=1 e2e/
    log "screenshots: $(ls e2e/artifacts/*.png | wc -l) in ui/e2e/artifacts/"
    ;;
  *)
    echo "usage: scripts/ui.sh build|check|e2e" >&2
    exit 2
    ;;
esac
