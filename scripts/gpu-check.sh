#!/usr/bin/env bash
# Usage: scripts/gpu-check.sh — on a machine with an NVIDIA GPU, checks kiln's GPU paths for real.
# Not part of scripts/test.sh: CI and this project's own machine have no GPU.
#
# It builds the glibc `kiln` (the static musl build cannot dlopen NVML), runs `kiln up` in a
# throw-away KILN_HOME with the idle-GPU watchdog at 60 s, and checks:
#   1. the runner found the GPUs through NVML (`kiln_runner_nvml_load_failed` is 0 and a
#      `--gpus 1` job is placed at all);
#   2. a `--gpus 1` job sees one device: `nvidia-smi` inside it lists exactly one GPU, and it has
#      CUDA_DEVICE_ORDER=PCI_BUS_ID with the CUDA_VISIBLE_DEVICES (process) or device request
#      (container) the runner assigned;
#   3. `sys/gpu_percent` of a job running a GPU busy loop goes above 50 (the loop is PyTorch's
#      matmul: KILN_GPU_CHECK_IMAGE, default pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime,
#      with Docker and the NVIDIA container toolkit; without Docker, python3 with torch on the
#      host);
#   4. the idle-GPU watchdog stops a job that holds a GPU and does nothing (reason "idle GPU").
# With no NVIDIA GPU it says so plainly and exits 2, having checked nothing.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { printf '\033[1mgpu-check:\033[0m %s\n' "$*" >&2; }
fail() { log "FAILED: $*"; exit 1; }

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  log "no NVIDIA GPU on this machine (nvidia-smi is missing or lists no GPU): nothing was checked"
  exit 2
fi
log "GPUs: $(nvidia-smi -L | tr '\n' ';')"

cd "$repo"
cargo build --release -p kiln-cli
kiln="$repo/target/release/kiln"
home=$(mktemp -d)
trap 'kill "$up_pid" 2>/dev/null || true; wait "$up_pid" 2>/dev/null || true; rm -rf "$home"' EXIT
export KILN_HOME="$home"
"$kiln" up --home "$home" --idle-gpu-window-secs 60 >"$home/up.log" 2>&1 &
up_pid=$!
for _ in $(seq 1 120); do "$kiln" ps >/dev/null 2>&1 && break; sleep 1; done
"$kiln" ps >/dev/null || fail "kiln up did not answer: $(tail -n 20 "$home/up.log")"

# 1. NVML loaded.
if curl -fsS http://127.0.0.1:9470/metrics | grep -q '^kiln_runner_nvml_load_failed 1'; then
  fail "NVML did not load (see $home/up.log)"
fi

image_args=()
if docker info >/dev/null 2>&1; then
  image_args=(--image "${KILN_GPU_CHECK_IMAGE:-pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime}")
fi

# 2. One device, in PCI bus order.
out=$("$kiln" run --no-code --gpus 1 "${image_args[@]}" -f -- sh -c \
  'nvidia-smi --query-gpu=index,pci.bus_id,name --format=csv,noheader; echo "order=$CUDA_DEVICE_ORDER visible=${CUDA_VISIBLE_DEVICES:-}"')
log "the job saw: $out"
[ "$(printf '%s\n' "$out" | grep -c ', ')" = 1 ] || fail "the job saw other than one GPU"
printf '%s\n' "$out" | grep -q 'order=PCI_BUS_ID' || fail "CUDA_DEVICE_ORDER is not PCI_BUS_ID"

# 3. sys/gpu_percent follows a busy loop.
busy='import torch, time
x = torch.randn(8192, 8192, device="cuda")
end = time.time() + 90
while time.time() < end:
    x = (x @ x).clamp(-1, 1)
    torch.cuda.synchronize()'
job=$("$kiln" run --no-code --gpus 1 "${image_args[@]}" -- python3 -c "$busy")
peak=0
for _ in $(seq 1 60); do
  value=$("$kiln" metrics "$job" --key sys/gpu_percent -o json 2>/dev/null | python3 -c 'import json,sys
try: print(int(float(json.load(sys.stdin)[0]["value"])))
except Exception: print(0)')
  [ "$value" -gt "$peak" ] && peak=$value
  [ "$peak" -gt 50 ] && break
  sleep 2
done
"$kiln" stop "$job" >/dev/null || true
[ "$peak" -gt 50 ] || fail "sys/gpu_percent of a busy job peaked at $peak%"
log "sys/gpu_percent of the busy job reached $peak%"

# 4. The idle-GPU watchdog stops an idle job.
idle=$("$kiln" run --no-code --gpus 1 "${image_args[@]}" -- sleep 600)
for _ in $(seq 1 60); do
  reason=$("$kiln" status "$idle" -o json | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["state"], j.get("reason",""))')
  case $reason in STOPPED*) break ;; esac
  sleep 5
done
case $reason in "STOPPED idle GPU"*) log "the watchdog stopped the idle job: $reason" ;; *) fail "the idle job: $reason" ;; esac
log "all GPU checks passed"
