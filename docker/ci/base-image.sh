#!/usr/bin/env bash
# Make a Debian bookworm base image without a registry: debootstrap a minimal root filesystem
# from this machine's own Debian mirror and `docker import` it. CI builds every image on it
# (docker/*.Dockerfile take it as BASE_IMAGE / PYTHON_IMAGE); production uses the official
# images and never runs this.
#
#   docker/ci/base-image.sh [IMAGE]          default: vidlora-ci-base:bookworm
#
# Kept if the image already exists (delete it to rebuild).
set -euo pipefail
image=${1:-vidlora-ci-base:bookworm}
if docker image inspect "$image" >/dev/null 2>&1; then
  echo "base image $image exists"
  exit 0
fi
# The mirror apt already uses (deb822 "URIs:" or one-line "deb URL suite"), else Debian's.
mirror=$(grep -hoE '^URIs: *[^ ]+' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security | head -1 | awk '{print $2}' || true)
[ -n "$mirror" ] || mirror=$(grep -hoE '^deb +(\[[^]]*\] +)?[^ ]+' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
                             | grep -v security | head -1 | awk '{print $NF}' || true)
mirror=${mirror:-http://deb.debian.org/debian}
command -v debootstrap >/dev/null || { DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null; }
rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >/dev/null
# The image's apt sources: the same mirror and suites the build machine uses.
cat > "$rootfs/etc/apt/sources.list" <<SOURCES
deb $mirror bookworm main
deb $mirror bookworm-updates main
SOURCES
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | docker import - "$image" >/dev/null
echo "base image $image imported from $mirror"
