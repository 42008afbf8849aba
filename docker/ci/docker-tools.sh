#!/usr/bin/env bash
# Make sure this machine can build and run the compose stack: Docker's engine (Debian's
# docker.io), running; and the Compose v2 and Buildx CLI plugins, which bookworm does not
# package (its docker-compose is the old v1), taken from Debian trixie's packages through apt
# with a private list directory (signatures checked as usual; the machine's own apt sources are
# not changed). Needs root. Idempotent: does nothing that is already done.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

if ! command -v dockerd >/dev/null; then
  apt-get install -y -q docker.io >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q docker.io >/dev/null; }
fi

if ! docker info >/dev/null 2>&1; then
  # No init system here: start the daemon in the background, logging beside its data.
  mkdir -p /var/lib/docker
  nohup dockerd >/var/lib/docker/dockerd.log 2>&1 &
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { tail -20 /var/lib/docker/dockerd.log >&2; exit 1; }
fi

if ! docker compose version >/dev/null 2>&1 || ! docker buildx version >/dev/null 2>&1; then
  mirror=$(grep -hoE '^URIs: *[^ ]+' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security | head -1 | awk '{print $2}' || true)
  mirror=${mirror:-http://deb.debian.org/debian}
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  chmod 755 "$work"  # apt drops to _apt for downloads
  mkdir -p "$work/lists/partial" "$work/debs"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main" > "$work/trixie.list"
  apt_opts=(-o "Dir::Etc::sourcelist=$work/trixie.list" -o "Dir::Etc::sourceparts=-" -o "Dir::State::Lists=$work/lists")
  apt-get "${apt_opts[@]}" update -q >/dev/null
  (cd "$work/debs" && apt-get "${apt_opts[@]}" download -q docker-compose docker-buildx >/dev/null)
  dpkg -i "$work"/debs/*.deb >/dev/null
fi
docker compose version
