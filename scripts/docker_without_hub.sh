#!/usr/bin/env bash
# Prepare `docker compose build` on a machine that reaches Debian's and PyPI's package servers but
# no image registry (and perhaps PyPI only through a TLS proxy). Needs root and a running Docker.
#   eval "$(scripts/docker_without_hub.sh)"     # then: docker compose up --build --wait
# 1. streamkit-base:bookworm: Python 3.11 from Debian packages (debootstrap), for BASE_IMAGE
# 2. streamkit-redis:bookworm: Debian's redis-server on that base (docker/redis.Dockerfile)
# 3. docker/local/: this machine's CA bundle and, where pip's find-links has one, torch's CPU wheel
# It prints the environment that points docker-compose.yml at them. With Docker Hub none of this is
# needed: the defaults are python:3.11-slim, redis:7-alpine and PyTorch's CPU index.
set -euo pipefail
cd "$(dirname "$0")/.."
base=streamkit-base:bookworm
redis=streamkit-redis:bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
log() { printf '[docker_without_hub] %s\n' "$*" >&2; }

if ! docker image inspect "$base" >/dev/null 2>&1; then
  command -v debootstrap >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
  root=$(mktemp -d)
  trap 'rm -rf "$root"' EXIT
  log "debootstrap bookworm -> $base"
  # python3 is 3.11 on bookworm; python3-venv brings ensurepip (Debian's pip refuses system installs)
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root" "$mirror" >/dev/null
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb
  tar -C "$root" -c . | docker import --change 'CMD ["python3"]' --change 'ENV LANG=C.UTF-8' - "$base" >/dev/null
fi
if ! docker image inspect "$redis" >/dev/null 2>&1; then
  log "building $redis"
  docker build -q -f docker/redis.Dockerfile --build-arg BASE_IMAGE="$base" -t "$redis" docker >/dev/null
fi

cp /etc/ssl/certs/ca-certificates.crt docker/local/ca.crt
torch_args="--index-url https://download.pytorch.org/whl/cpu"
for dir in ${PIP_FIND_LINKS:-} $(pip config get global.find-links 2>/dev/null || true); do
  for whl in "$dir"/torch-2.13.0+cpu-cp311-*.whl; do
    if [ -f "$whl" ]; then
      cp -n "$whl" docker/local/
      torch_args="--find-links /opt/local"
    fi
  done
done
log "ready: base $base, redis $redis, torch from: $torch_args"
echo "export STREAMKIT_BASE_IMAGE=$base STREAMKIT_REDIS_IMAGE=$redis STREAMKIT_TORCH_PIP_ARGS='$torch_args'"
