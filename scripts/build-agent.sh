#!/usr/bin/env bash
# Builds kiln-agent as a static executable (glibc linked in, no shared libraries), the one the
# runner copies into batch workers' containers: any image can run it, even one without libc.
#   scripts/build-agent.sh [--release]
# Output: target/x86_64-unknown-linux-gnu/<debug|release>/kiln-agent. An explicit --target keeps
# these static objects apart from the dynamic ones of the normal build.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
target=$(rustc -vV | sed -n 's/^host: //p')
cd "$repo"
RUSTFLAGS="-C target-feature=+crt-static" cargo build --locked -p kiln-agent --target "$target" "$@"
profile=debug
[ "${1:-}" = "--release" ] && profile=release
agent="$repo/target/$target/$profile/kiln-agent"
if ldd "$agent" 2>&1 | grep -q "=>"; then
  echo "build-agent: $agent is not static" >&2
  exit 1
fi
echo "$agent"
