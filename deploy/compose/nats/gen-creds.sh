#!/usr/bin/env bash
# Makes the NATS users of the compose stack: one NKey seed per kiln service in nats/creds/
# (<service>.nk; made once, kept after) and nats/users.conf, the `authorization` block the
# three nats-servers `include`, admitting those users only, each with the subjects it needs
# (the table of kiln_core::nats_auth, rendered by `kiln nats-users`). Run it before the first
# `docker compose up`, and again after upgrading kiln (the table may grow; the seeds stay).
#
#   deploy/compose/nats/gen-creds.sh          uses `kiln` from $KILN_BIN, PATH, or target/
#
# Neither file is committed (.gitignore): users.conf holds public keys only, the seeds are the
# services' secrets. The creds directory is 0700 (only you on the host); the seed files are
# 0444 inside it, because each kiln container (user 10001) reads its own seed through a bind
# mount (compose `secrets:`), and compose cannot change a mounted file's owner.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)

kiln=${KILN_BIN:-}
if [ -z "$kiln" ]; then
  for candidate in "$(command -v kiln || true)" "$repo/target/release/kiln" "$repo/target/debug/kiln"; do
    if [ -n "$candidate" ] && [ -x "$candidate" ]; then
      kiln=$candidate
      break
    fi
  done
fi
if [ -z "$kiln" ]; then
  echo "gen-creds: no kiln binary: build it (cargo build -p kiln-cli) or set KILN_BIN" >&2
  exit 1
fi

"$kiln" nats-users --seeds-dir "$here/creds" --out "$here/users.conf"
chmod 0700 "$here/creds"
chmod 0444 "$here"/creds/*.nk
chmod 0644 "$here/users.conf"
