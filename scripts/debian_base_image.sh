#!/usr/bin/env bash
# Build a Python 3.11 base image from Debian packages, for machines that reach Debian's and PyPI's
# package servers but no image registry:
#   scripts/debian_base_image.sh [TAG]      (default streamkit-base:bookworm; needs root and debootstrap)
#   docker compose build --build-arg BASE_IMAGE=streamkit-base:bookworm
# With Docker Hub at hand none of this is needed: the Dockerfile's default base is python:3.11-slim.
set -euo pipefail
tag=${1:-streamkit-base:bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "$tag exists"; exit 0
fi
command -v debootstrap >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
# python3 is 3.11 on bookworm; python3-venv brings ensurepip (Debian's own pip refuses system installs)
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root" "$mirror" >/dev/null
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb
tar -C "$root" -c . | docker import --change 'CMD ["python3"]' --change 'ENV LANG=C.UTF-8' - "$tag" >/dev/null
echo "built $tag"
