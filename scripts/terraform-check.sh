#!/usr/bin/env bash
# The offline checks of deploy/terraform, as CI runs them (no AWS account, no provider download):
#   - tofu fmt -check: OpenTofu 1.10.6, built from its module on the Go module proxy
#   - tflint 0.61.0 with its bundled terraform ruleset only (deploy/terraform/.tflint.hcl)
#   - the templates: deploy/terraform/tests/render renders every user data and TOML config with
#     tofu (that configuration needs no provider) and tests/render/check.py parses them and
#     compares the config keys with deploy/compose/config
#   - checkov 3.3.30 (PyPI, in a venv of its own), --framework terraform: no failed check; a
#     deliberate exception is skipped inline with `#checkov:skip=CKV_...: reason`
# `tofu init` / `tofu validate` are not run: they need the AWS provider from the provider
# registry, which CI cannot reach (deploy/terraform/README.md).
# Tools are installed into $KILN_TOOLS/bin (default ~/.kiln/tools/bin) unless that version is
# there. A cold install (empty Go caches) took 4.6 to 5.2 minutes for tofu, 1.7 to 5 for tflint
# (the second figure on a busy machine) and under 1 for checkov on 2 cores; the checks, 15 s.
# Go's caches for those builds are a temp dir removed after them (scripts/go-tools.sh).
set -euo pipefail

OPENTOFU_VERSION=1.10.6
TFLINT_VERSION=0.61.0
CHECKOV_VERSION=3.3.30
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tf="$repo/deploy/terraform"
KILN_TOOLS=${KILN_TOOLS:-${KILN_HOME:-$HOME/.kiln}/tools}
bin="$KILN_TOOLS/bin"
mkdir -p "$bin"
# A TF_CLI_CONFIG_FILE naming a file that does not exist only makes tofu warn; nothing here needs one.
if [ -n "${TF_CLI_CONFIG_FILE:-}" ] && [ ! -e "$TF_CLI_CONFIG_FILE" ]; then unset TF_CLI_CONFIG_FILE; fi

log() { printf '\033[1mterraform-check:\033[0m %s\n' "$*" >&2; }
started=$SECONDS
step() { log "$1 ($((SECONDS - started)) s)"; }

# shellcheck source=scripts/go-tools.sh
. "$repo/scripts/go-tools.sh"

# --- OpenTofu ----------------------------------------------------------------------------------
# `go install …/cmd/tofu@v…` is refused (opentofu's go.mod has a replace directive), so the module
# is downloaded and built in place; version.dev=no is what release builds set (no "-dev" suffix).
tofu="$bin/tofu"
if [ "$("$tofu" version 2>/dev/null | head -n 1)" != "OpenTofu v$OPENTOFU_VERSION" ]; then
  find_go 24 "terraform-check: building OpenTofu $OPENTOFU_VERSION"
  go_scratch
  log "building OpenTofu $OPENTOFU_VERSION into $bin (a few minutes on a cold cache)"
  module_dir=$(GOTOOLCHAIN=auto "$go_bin" mod download -json "github.com/opentofu/opentofu@v$OPENTOFU_VERSION" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
  (cd "$module_dir" && GOTOOLCHAIN=auto GOFLAGS=-mod=readonly nice "$go_bin" build -trimpath \
    -ldflags "-s -w -X github.com/opentofu/opentofu/version.dev=no" -o "$tofu.new" ./cmd/tofu)
  mv "$tofu.new" "$tofu"
fi
step "$("$tofu" version | head -n 1)"

# --- tflint ------------------------------------------------------------------------------------
tflint="$bin/tflint"
# The first line only: `grep -q` would end the pipe early, and pipefail read that as a failure.
if [ "$("$tflint" --version 2>/dev/null | head -n 1)" != "TFLint version $TFLINT_VERSION" ]; then
  find_go 24 "terraform-check: building tflint $TFLINT_VERSION"
  go_scratch
  log "installing tflint $TFLINT_VERSION into $bin"
  GOBIN="$bin" GOTOOLCHAIN=auto nice "$go_bin" install "github.com/terraform-linters/tflint@v$TFLINT_VERSION"
fi
step "tflint $TFLINT_VERSION"
go_scratch_done

# --- checkov -----------------------------------------------------------------------------------
checkov_venv="$KILN_TOOLS/checkov-$CHECKOV_VERSION"
checkov="$checkov_venv/bin/checkov"
if [ "$("$checkov" --version 2>/dev/null)" != "$CHECKOV_VERSION" ]; then
  log "installing checkov $CHECKOV_VERSION into $checkov_venv"
  rm -rf "$checkov_venv"
  python3 -m venv "$checkov_venv"
  nice "$checkov_venv/bin/pip" install --quiet --disable-pip-version-check "checkov==$CHECKOV_VERSION"
fi
step "checkov $CHECKOV_VERSION"

# --- checks ------------------------------------------------------------------------------------
work=$(mktemp -d /tmp/kiln-terraform-check.XXXXXX)
trap 'rm -rf "$work"' EXIT

log "tofu fmt -check -recursive"
"$tofu" fmt -check -recursive -diff "$tf"

log "tflint --recursive"
(cd "$tf" && "$tflint" --recursive --config="$tf/.tflint.hcl" --format=compact)

log "rendering the user data and configs (tests/render)"
(cd "$tf/tests/render" &&
  TF_DATA_DIR="$work/data" "$tofu" init -input=false -no-color >/dev/null &&
  TF_DATA_DIR="$work/data" "$tofu" apply -auto-approve -input=false -no-color -state="$work/render.tfstate" >/dev/null &&
  TF_DATA_DIR="$work/data" "$tofu" output -no-color -state="$work/render.tfstate" -json >"$work/render.json")
python3 "$tf/tests/render/check.py" <"$work/render.json"

log "checkov --framework terraform"
"$checkov" --directory "$tf" --framework terraform --skip-download --compact --quiet
step "all terraform checks passed"
