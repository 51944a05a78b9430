#!/usr/bin/env bash
# Writes the Python SDK's generated files, which are committed so that sdk/python builds alone
# (an sdist or a copy of the folder has no ../../proto):
#   - sdk/python/kiln/v1/*_pb2.py, *_pb2_grpc.py and __init__.py, from proto/kiln/v1/*.proto
#   - sdk/python/kiln/_version.py, from `[workspace.package] version` of the root Cargo.toml, so
#     the package and the Rust crates carry one version
#   scripts/sdk-stubs.sh           regenerate them in place (commit the result)
#   scripts/sdk-stubs.sh --check   regenerate into a temp dir and fail if the committed files differ
# The generator is grpcio-tools 1.80.1 in a venv under target/, not the newest release: the
# *_pb2_grpc.py it writes refuse a grpcio older than itself, and 1.80 is the last grpcio with
# wheels for Python 3.9 (docs/design-notes.md, "The SDK as a package").
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { printf '\033[1msdk-stubs:\033[0m %s\n' "$*" >&2; }

GRPCIO_TOOLS=1.80.1
check=0
case "${1:-}" in
  "") ;;
  --check) check=1 ;;
  *) echo "usage: scripts/sdk-stubs.sh [--check]" >&2; exit 64 ;;
esac

sdk="$repo/sdk/python"
venv="$repo/target/sdk-stubs-venv"
if ! "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('grpcio-tools') != '$GRPCIO_TOOLS')" 2>/dev/null; then
  log "grpcio-tools $GRPCIO_TOOLS into $venv"
  mkdir -p "$repo/target"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "grpcio-tools==$GRPCIO_TOOLS"
fi

version=$(awk '
  /^\[/ { section = $0; next }
  section == "[workspace.package]" && $1 == "version" { gsub(/"/, "", $3); print $3; exit }
' "$repo/Cargo.toml")
if [ -z "$version" ]; then
  echo "sdk-stubs: no version under [workspace.package] in $repo/Cargo.toml" >&2
  exit 1
fi

# generate DIR: the files as they should be, laid out as sdk/python is (DIR/kiln/...).
generate() {
  local out=$1
  mkdir -p "$out/kiln/v1"
  (cd "$repo/proto" && "$venv/bin/python" -m grpc_tools.protoc -I. \
    --python_out="$out" --grpc_python_out="$out" kiln/v1/*.proto)
  printf '"""gRPC stubs of kiln.v1, generated from proto/kiln/v1 by scripts/sdk-stubs.sh: do not edit."""\n' \
    > "$out/kiln/v1/__init__.py"
  cat > "$out/kiln/_version.py" <<EOF
# Written by scripts/sdk-stubs.sh from [workspace.package] in Cargo.toml: do not edit.
__version__ = "$version"
EOF
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
generate "$tmp"

if [ "$check" = 1 ]; then
  # Only the generated files are compared: kiln/v1 holds nothing else, and kiln/_version.py.
  same=1
  diff -rq -x __pycache__ "$tmp/kiln/v1" "$sdk/kiln/v1" > "$tmp/files" 2>&1 || same=0
  diff "$tmp/kiln/_version.py" "$sdk/kiln/_version.py" > "$tmp/version" 2>&1 || same=0
  if [ "$same" = 0 ]; then
    {
      echo "sdk-stubs: FAILED: the committed generated files of sdk/python are not what proto/ and Cargo.toml give"
      sed "s|$tmp/|generated |g; s|$sdk/|committed sdk/python/|g" "$tmp/files"
      [ -s "$tmp/version" ] && { echo "kiln/_version.py (generated: <, committed: >):"; cat "$tmp/version"; }
      echo "sdk-stubs: run scripts/sdk-stubs.sh and commit sdk/python/kiln/v1 and sdk/python/kiln/_version.py"
    } >&2
    exit 1
  fi
  log "sdk/python/kiln/v1 and kiln/_version.py ($version) match proto/ and Cargo.toml"
  exit 0
fi

rm -rf "$sdk/kiln/v1"
cp -r "$tmp/kiln/v1" "$sdk/kiln/v1"
cp "$tmp/kiln/_version.py" "$sdk/kiln/_version.py"
log "wrote sdk/python/kiln/v1 ($(ls "$sdk/kiln/v1" | wc -l) files) and kiln/_version.py ($version)"
