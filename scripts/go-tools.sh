# Sourced by the scripts that build Go tools from the Go module proxy (setup.sh: versitygw and
# amazon-ec2-metadata-mock; terraform-check.sh: OpenTofu and tflint).
#   find_go MINOR   sets go_bin to a Go 1.MINOR or later on PATH or in /usr/local/go/bin, or exits
#                   with what is missing (the tools' own go.mod may fetch a later Go themselves:
#                   GOTOOLCHAIN=auto)
#   go_scratch      points Go's module and build caches at a temp dir of their own, which
#                   go_scratch_done removes (and the shell's exit, should a build fail). A cold
#                   build of these tools fills about 5 GB of caches (OpenTofu's modules alone,
#                   3 GB) that nothing reads again once the binaries are in $KILN_TOOLS/bin, and
#                   that CI's disk needs for the tests; a developer's own ~/go caches are left alone.

find_go() {
  local minor=$1 need=$2
  go_bin=$(command -v go || true)
  [ -n "$go_bin" ] || [ ! -x /usr/local/go/bin/go ] || go_bin=/usr/local/go/bin/go
  local have=
  [ -z "$go_bin" ] || have=$(GOTOOLCHAIN=local "$go_bin" env GOVERSION 2>/dev/null | sed -nE 's/^go1\.([0-9]+).*/\1/p')
  if [ -z "$have" ] || [ "$have" -lt "$minor" ]; then
    echo "$need needs Go 1.$minor or later (https://go.dev/dl) on PATH or in /usr/local/go/bin" >&2
    exit 1
  fi
}

go_scratch() {
  [ -z "${go_scratch_dir:-}" ] || return 0
  go_scratch_dir=$(mktemp -d /tmp/kiln-go-scratch.XXXXXX)
  export GOMODCACHE="$go_scratch_dir/mod" GOCACHE="$go_scratch_dir/build"
  trap go_scratch_done EXIT
}

go_scratch_done() {
  [ -n "${go_scratch_dir:-}" ] || return 0
  # The module cache is read-only by design.
  chmod -R u+w "$go_scratch_dir" 2>/dev/null || true
  rm -rf "$go_scratch_dir"
  go_scratch_dir=
  unset GOMODCACHE GOCACHE
}
