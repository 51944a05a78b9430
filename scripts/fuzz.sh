#!/usr/bin/env bash
# Runs every cargo-fuzz target of fuzz/ for a bounded time, each from its committed seed corpus
# (fuzz/corpus/<target>/), and fails on the first crash, panic, leak, timeout or out-of-memory:
#   - needs a nightly Rust toolchain through rustup (KILN_FUZZ_TOOLCHAIN, default `nightly`);
#     without one it says so loudly and fails (scripts/test.sh checks first, and skips loudly)
#   - installs cargo-fuzz 0.13.1 (`cargo install --locked`, with the pinned stable toolchain)
#     into ~/.cargo/bin when that version is missing
#   - builds the targets once, with debug assertions (so integer overflow is a crash), into
#     fuzz/target/; the first build takes about 4 minutes on 2 cores
#   - KILN_FUZZ_SECONDS per target (default 20), KILN_FUZZ_TARGETS (space-separated) to run only
#     some; new inputs go to a temp dir, so the committed corpus is left as it is
#   - a crash leaves its input in fuzz/artifacts/<target>/; replay it with
#     `cargo +nightly fuzz run -a <target> fuzz/artifacts/<target>/<file>` in fuzz/
set -euo pipefail

CARGO_FUZZ_VERSION=0.13.1
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
toolchain=${KILN_FUZZ_TOOLCHAIN:-nightly}
seconds=${KILN_FUZZ_SECONDS:-20}
export PATH="$HOME/.cargo/bin:$PATH"
log() { printf '\033[1mfuzz:\033[0m %s\n' "$*" >&2; }

if ! rustup run "$toolchain" rustc --version >/dev/null 2>&1; then
  log "!!! the Rust toolchain '$toolchain' is not installed: fuzzing was NOT run !!!"
  log "(cargo-fuzz needs nightly: \`rustup toolchain install nightly\`, or set KILN_FUZZ_TOOLCHAIN)"
  exit 1
fi
log "$(rustup run "$toolchain" rustc --version)"

if [ "$(cargo-fuzz --version 2>/dev/null | awk '{ print $NF }')" != "$CARGO_FUZZ_VERSION" ]; then
  log "installing cargo-fuzz $CARGO_FUZZ_VERSION into $HOME/.cargo/bin"
  (cd "$repo" && nice cargo install --quiet --locked --root "$HOME/.cargo" cargo-fuzz --version "$CARGO_FUZZ_VERSION")
fi
log "cargo-fuzz $CARGO_FUZZ_VERSION"

cd "$repo/fuzz"
started=$SECONDS
log "building the fuzz targets"
nice cargo +"$toolchain" fuzz build --debug-assertions
log "built in $((SECONDS - started)) s"

targets=${KILN_FUZZ_TARGETS:-$(cargo +"$toolchain" fuzz list)}
work=$(mktemp -d /tmp/kiln-fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT
for target in $targets; do
  [ -d "corpus/$target" ] || { log "no seed corpus at fuzz/corpus/$target"; exit 1; }
  mkdir -p "$work/$target"
  log "$target: ${seconds} s from $(ls "corpus/$target" | wc -l) seeds"
  # libFuzzer writes new inputs to the first directory and only reads the others.
  nice cargo +"$toolchain" fuzz run --debug-assertions "$target" "$work/$target" "corpus/$target" -- \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 2>"$work/$target.log" || {
    tail -n 60 "$work/$target.log" >&2
    log "$target FAILED: its input is in fuzz/artifacts/$target/"
    exit 1
  }
  grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb' "$work/$target.log" | tr '\n' ' ' >&2
  echo >&2
done
log "every target ran ${seconds} s without a failure ($((SECONDS - started)) s in all)"
