#!/usr/bin/env bash
# Makes sure a Docker Engine answers, for the docker provider of `kiln up` (jobs with --image):
# at DOCKER_HOST, by default the local socket unix:///var/run/docker.sock. When none answers
# there it tries `service docker start`, and when that fails (containers refuse the init
# script's ulimit) starts dockerd in the background itself, with its pid file and log in
# /var/lib/kiln (dockerd.pid, dockerd.log). Idempotent; scripts/setup.sh runs it, and it can
# be run again after a reboot. Stop that dockerd with: kill "$(cat /var/lib/kiln/dockerd.pid)"
set -euo pipefail

default_host=unix:///var/run/docker.sock
host=${DOCKER_HOST:-$default_host}
state_dir=/var/lib/kiln

log() { printf '\033[1mdocker-engine:\033[0m %s\n' "$*" >&2; }
as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}
answers() { DOCKER_HOST="$host" docker info >/dev/null 2>&1; }
wait_for_engine() {
  for _ in $(seq 1 100); do
    answers && return 0
    sleep 0.2
  done
  return 1
}

if ! command -v docker >/dev/null 2>&1 || ! command -v dockerd >/dev/null 2>&1; then
  log "docker.io is not installed: run scripts/setup.sh (or apt-get install docker.io)"
  exit 1
fi
if answers; then
  log "Docker Engine $(DOCKER_HOST="$host" docker version --format '{{.Server.Version}}') answers at $host"
  exit 0
fi
if [ "$host" != "$default_host" ]; then
  log "no Docker Engine answers at DOCKER_HOST=$host: start one there, or unset DOCKER_HOST and rerun this script"
  exit 1
fi
if as_root service docker start >/dev/null 2>&1 && wait_for_engine; then
  log "started Docker Engine (service docker start)"
  exit 0
fi
as_root mkdir -p "$state_dir"
log "starting dockerd in the background (pid file $state_dir/dockerd.pid, log $state_dir/dockerd.log)"
as_root sh -c "setsid dockerd --host '$default_host' --pidfile '$state_dir/dockerd.pid' \
  >'$state_dir/dockerd.log' 2>&1 </dev/null &"
if wait_for_engine; then
  log "Docker Engine $(docker version --format '{{.Server.Version}}') answers at $host"
  exit 0
fi
tail -n 20 "$state_dir/dockerd.log" >&2 || true
log "dockerd did not start (log above); start a Docker Engine yourself with: sudo dockerd &"
exit 1
