#!/usr/bin/env bash
# Checks that the Python SDK is a package people can install, on the oldest and the newest
# Python it claims (3.9 and 3.13):
#   - builds the sdist from sdk/python in the repository (setup.py generates kiln/v1 from proto/
#     and kiln/_version.py from Cargo.toml into sdk/python, gitignored, and the sdist carries
#     them), checks it has them, then copies only the sdist file to a temp dir and builds the
#     wheel from it there, without the repository (build 1.6.1, venv target/sdk-build-venv)
#   - for each interpreter: a venv with the wheel, where `import kiln, kiln.v1` gives the version
#     of Cargo.toml, every module imports, compileall passes on the sdist's package and tests, and
#     the tests that need no server run (tests/test_serve.py, tests/test_checkpoint.py); and a
#     venv with the sdist (built again there, by that interpreter), which imports too
#   - on 3.13, `mypy --strict -p kiln` on the installed wheel (its `typecheck` extra: mypy and the
#     stubs it needs), as a user's checker sees it: py.typed and kiln/v1's generated .pyi
#     (mypy 2 runs on 3.10 and up, so not on 3.9)
#   - 3.9 gets the oldest dependencies pyproject.toml allows (grpcio, protobuf, pathspec, pyyaml and tomli at their
#     floors), 3.13 the newest ones this script pins, so both ends of the ranges are tried
# The interpreters: $KILN_PYTHON39 and $KILN_PYTHON313 when set, else pyenv's
# ($PYENV_ROOT/versions/3.9.*, 3.13.*), else python3.9 / python3.13 on PATH. Neither PyPI nor
# Debian 12 carries a CPython 3.9 or 3.13 that runs here (docs/design-notes.md, "The SDK as a
# package"), so a missing one fails the check, naming it: nothing is skipped.
#   scripts/sdk-package-check.sh
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { printf '\033[1msdk-package:\033[0m %s\n' "$*" >&2; }
fail() { printf '\033[1msdk-package: FAILED:\033[0m %s\n' "$*" >&2; exit 1; }
start=$SECONDS

# Every tool and every package installed here is pinned.
BUILD=1.6.1
PIP=26.0.1
SETUPTOOLS=82.0.1 # the build backend, for the wheel and each sdist install; the last for 3.9
PYTEST=8.4.2      # the last for 3.9
# protobuf 6.32.1: the floor of pyproject.toml's build requires (mypy-protobuf's plugins need it);
# types-protobuf comes with mypy-protobuf, unused by the build (6.30.2.20250914: one for 3.9 too).
BUILD_ENV_DEPS=(grpcio==1.80.1 protobuf==6.32.1 types-protobuf==6.30.2.20250914)
OLDEST_DEPS=(grpcio==1.80.1 protobuf==6.31.1 pathspec==1.1.0 pyyaml==6.0.1 tomli==1.1.0 numpy==2.0.2)
NEWEST_DEPS=(grpcio==1.85.3 protobuf==7.36.2 pathspec==1.1.1 pyyaml==6.0.4 numpy==2.5.5)

export PIP_DISABLE_PIP_VERSION_CHECK=1
# The version the package must carry: the workspace's (setup.py reads it there too).
version=$(awk '
  /^\[/ { section = $0; next }
  section == "[workspace.package]" && $1 == "version" { gsub(/"/, "", $3); print $3; exit }
' "$repo/Cargo.toml")
[ -n "$version" ] || fail "no version under [workspace.package] in $repo/Cargo.toml"

# find_python MAJOR.MINOR VAR: the path of an interpreter of that version, or a failure naming it.
find_python() {
  local want=$1 var=$2 candidates=() py got
  if [ -n "${!var:-}" ]; then
    candidates=("${!var}")
  else
    local root=${PYENV_ROOT:-$HOME/.pyenv}
    # The newest patch release pyenv has of that version, then the one on PATH.
    while IFS= read -r py; do candidates+=("$py"); done < <(
      ls -d "$root/versions/$want".* 2>/dev/null | grep -E "/$want\.[0-9]+$" | sort -t. -k3,3n -r \
        | sed 's|$|/bin/python|')
    py=$(command -v "python$want" 2>/dev/null || true)
    [ -n "$py" ] && candidates+=("$py")
  fi
  for py in "${candidates[@]}"; do
    got=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true)
    if [ "$got" = "$want" ]; then
      echo "$py"
      return
    fi
    [ -n "${!var:-}" ] && fail "$var=$py is not a Python $want (it says '${got:-nothing}')"
  done
  fail "no Python $want: set $var to one, or install it (pyenv install $want; Debian's python$want where the release has it). Neither PyPI nor Debian 12 has one for this check to fetch"
}
py39=$(find_python 3.9 KILN_PYTHON39)
py313=$(find_python 3.13 KILN_PYTHON313)
log "Python 3.9: $py39 ($("$py39" -V 2>&1)); Python 3.13: $py313 ($("$py313" -V 2>&1))"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[ -n "${KILN_SDK_PACKAGE_KEEP:-}" ] && trap 'log "kept $work"' EXIT
# The build env's packages, for build's own isolated env (PIP_CONSTRAINT, given to it below) and
# for pip building the sdist in the venvs (PIP_BUILD_CONSTRAINT): the backend, and what the
# generators (grpcio-tools and mypy-protobuf, pinned in pyproject.toml) pull in, at the oldest they allow.
printf '%s\n' "setuptools==$SETUPTOOLS" "${BUILD_ENV_DEPS[@]}" > "$work/constraints.txt"
export PIP_BUILD_CONSTRAINT="$work/constraints.txt"

build_venv="$repo/target/sdk-build-venv"
if ! "$build_venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('build') != '$BUILD')" 2>/dev/null; then
  log "build $BUILD into $build_venv"
  mkdir -p "$repo/target"
  rm -rf "$build_venv"
  python3 -m venv "$build_venv"
  "$build_venv/bin/pip" install -q "pip==$PIP" "build==$BUILD"
fi
# check_warnings NAME: fails, showing the log, when a build warned. (setuptools says byte-compiling
# is off in every wheel build: that one is no news.)
check_warnings() {
  grep -i "warning" "$work/$1.log" | grep -v "byte-compiling is disabled" > "$work/warnings.txt" || true
  if [ -s "$work/warnings.txt" ]; then
    cat "$work/$1.log" >&2
    fail "the $1 build warned (its log is above)"
  fi
}

log "building the sdist from sdk/python (stubs generated from proto/)"
PIP_CONSTRAINT="$work/constraints.txt" "$build_venv/bin/python" -m build --sdist --outdir "$work/dist" "$repo/sdk/python" \
  > "$work/sdist.log" 2>&1 || { cat "$work/sdist.log" >&2; fail "python -m build --sdist of sdk/python"; }
check_warnings sdist
sdist=$(ls "$work"/dist/kiln_sdk-"$version".tar.gz 2>/dev/null || true)
[ -n "$sdist" ] || fail "expected kiln_sdk-$version.tar.gz, got: $(ls "$work/dist")"
# What the sdist must carry: the build's files, py.typed, and a *_pb2.py and *_pb2_grpc.py per
# proto with their typed stubs (.pyi).
expected=(setup.py pyproject.toml PKG-INFO kiln/__init__.py kiln/_version.py kiln/py.typed kiln/v1/__init__.py)
for proto in "$repo"/proto/kiln/v1/*.proto; do
  name=$(basename "$proto" .proto)
  expected+=("kiln/v1/${name}_pb2.py" "kiln/v1/${name}_pb2.pyi" "kiln/v1/${name}_pb2_grpc.py" "kiln/v1/${name}_pb2_grpc.pyi")
done
tar -tzf "$sdist" > "$work/sdist.txt"
for member in "${expected[@]}"; do
  grep -qx "kiln_sdk-$version/$member" "$work/sdist.txt" || fail "the sdist lacks $member"
done
sdist_version=$(tar -xzOf "$sdist" "kiln_sdk-$version/kiln/_version.py" | sed -n 's/^__version__ = "\(.*\)"$/\1/p')
[ "$sdist_version" = "$version" ] || fail "the sdist's kiln/_version.py says '$sdist_version', Cargo.toml $version"

# The wheel from that one file, away from the repository: no proto/ or Cargo.toml around it.
mkdir "$work/alone"
cp "$sdist" "$work/alone/"
tar -C "$work/alone" -xzf "$work/alone/$(basename "$sdist")"
src="$work/alone/kiln_sdk-$version"
log "building the wheel from the sdist alone, in $work/alone"
PIP_CONSTRAINT="$work/constraints.txt" "$build_venv/bin/python" -m build --wheel --outdir "$work/dist" "$src" \
  > "$work/wheel.log" 2>&1 || { cat "$work/wheel.log" >&2; fail "python -m build --wheel of the sdist alone"; }
check_warnings wheel
grep -q "kiln-sdk: using the gRPC stubs and kiln/_version.py the sdist carries" "$work/wheel.log" \
  || { cat "$work/wheel.log" >&2; fail "the wheel's build did not take the sdist's stubs (its log is above)"; }
wheel=$(ls "$work"/dist/kiln_sdk-"$version"-py3-none-any.whl 2>/dev/null || true)
[ -n "$wheel" ] || fail "expected kiln_sdk-$version-py3-none-any.whl, got: $(ls "$work/dist")"
"$build_venv/bin/python" -c 'import sys, zipfile; print("\n".join(zipfile.ZipFile(sys.argv[1]).namelist()))' "$wheel" > "$work/wheel.txt"
for member in "${expected[@]}"; do
  case $member in kiln/*) grep -qx "$member" "$work/wheel.txt" || fail "the wheel lacks $member" ;; esac
done
generator=$("$build_venv/bin/python" -c 'import sys, zipfile; print(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]).decode())' \
  "$wheel" "kiln_sdk-$version.dist-info/WHEEL" | sed -n 's/^Generator: //p')
[ "$generator" = "setuptools ($SETUPTOOLS)" ] || fail "the wheel was built by '$generator', not setuptools $SETUPTOOLS"
log "built $(basename "$sdist") and, from it alone, $(basename "$wheel")"

# Run from a directory without a kiln/ in it, so the installed package is the one imported.
cd "$work"
MODULES="kiln, kiln.v1, kiln._run, kiln._address, kiln._client, kiln._batch, kiln._jobs, kiln._pack, kiln._errors, kiln._serve, kiln._tensors, kiln._sweep, kiln._track, kiln._checkpoint, kiln._manage, kiln._sweeps, kiln._registry, kiln._services, kiln._predict, kiln._tokens"
IMPORT_CHECK="
import sys, sysconfig
import $MODULES
assert kiln.__file__.startswith(sysconfig.get_paths()['purelib']), kiln.__file__
assert kiln.__version__ == '$version', kiln.__version__
import grpc, google.protobuf
print('kiln', kiln.__version__, 'on Python', sys.version.split()[0], 'grpcio', grpc.__version__, 'protobuf', google.protobuf.__version__)
"

# check LABEL PYTHON DEPS...: the wheel and the sdist on one interpreter.
check() {
  local label=$1 py=$2 venv out
  shift 2
  venv="$work/venv-$label-wheel"
  "$py" -m venv "$venv" || fail "$py -m venv (for Debian's python, install its -venv package)"
  "$venv/bin/pip" install -q "pip==$PIP"
  "$venv/bin/pip" install -q "$wheel" "$@" "pytest==$PYTEST" || fail "pip install of the wheel on Python $label"
  out=$("$venv/bin/python" -c "$IMPORT_CHECK") || fail "import on Python $label (wheel)"
  log "Python $label, wheel: $out"
  "$venv/bin/python" -m compileall -q "$src/kiln" "$src/tests" > /dev/null \
    || fail "compileall on Python $label"
  "$venv/bin/pytest" -q -p no:cacheprovider --rootdir "$src" \
    "$src/tests/test_serve.py" "$src/tests/test_checkpoint.py" > "$work/pytest-$label.log" 2>&1 \
    || { cat "$work/pytest-$label.log" >&2; fail "the SDK's server-free tests on Python $label"; }
  log "Python $label, wheel: $(tail -n 1 "$work/pytest-$label.log")"

  venv="$work/venv-$label-sdist"
  "$py" -m venv "$venv"
  "$venv/bin/pip" install -q "pip==$PIP"
  "$venv/bin/pip" install -q "$sdist" "$@" || fail "pip install of the sdist on Python $label"
  out=$("$venv/bin/python" -c "$IMPORT_CHECK") || fail "import on Python $label (sdist)"
  log "Python $label, sdist: $out"
}
check 3.9 "$py39" "${OLDEST_DEPS[@]}"
check 3.13 "$py313" "${NEWEST_DEPS[@]}"

# The wheel's types on 3.13, from $work (no kiln/ here: mypy finds the installed one, by py.typed).
venv="$work/venv-3.13-wheel"
"$venv/bin/pip" install -q "$wheel[typecheck]" "${NEWEST_DEPS[@]}" || fail "pip install of the wheel's typecheck extra"
"$venv/bin/python" -m mypy --strict --cache-dir "$work/mypy-cache" -p kiln > "$work/mypy.log" 2>&1 \
  || { cat "$work/mypy.log" >&2; fail "mypy --strict -p kiln on the installed wheel (Python 3.13)"; }
log "Python 3.13, wheel: $(tail -n 1 "$work/mypy.log") (mypy --strict -p kiln)"
log "passed in $((SECONDS - start)) s"
