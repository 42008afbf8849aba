# vidlora GPU worker image: one `vidlora worker gpu` per GPU (solo pool, one vLLM engine,
# every scenario adapter). Real vLLM CUDA wheels from PyPI with the torch they pin.
#
# vLLM 0.34.0 (requirements/gpu.txt): the newest release engine_patch's probes know (0.26-0.34),
# not yet measured on a GPU (docs/support-matrix.md); its CUDA wheel pins torch 2.14.0 built for
# CUDA 13.0, so the host driver must be 580 or newer. The fallback is 0.33.0, the release
# measured on the H200 (bench/results/vllm_0.33.md): set `vllm==0.33.0` in requirements/gpu.txt,
# run `scripts/lock.sh gpu`, rebuild (docs/deploy.md, "The GPU image"). Bump vLLM only
# together with engine_patch's checks.
#
# No CUDA base image: torch's nvidia-* wheels bring every CUDA library vLLM loads (cudart,
# cuBLAS, cuDNN, NCCL, nvrtc), and the driver comes from the host through the NVIDIA
# container runtime. So the base is plain Debian bookworm with Python 3.11, like the CPU
# image (CI passes a debootstrapped one: docker/ci/base-image.sh; no registry needed), and
# the NVIDIA_* variables the nvidia/cuda images carry are set below, so the runtime still
# mounts the driver and refuses a host driver too old for CUDA 13.0 at start instead of
# vLLM failing later.
#
# Build: docker build -f docker/gpu.Dockerfile -t vidlora-gpu .
# Offline or behind a TLS proxy: as docker/cpu.Dockerfile (PYTHON_IMAGE, the ca_bundle
# secret); docker/ci/build.sh TAG gpu does it the way CI does.
# No "# syntax=" line: BuildKit would fetch that frontend from a registry.

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# ---- os: Python 3.11 plus what vLLM needs at run time ---------------------------------------
FROM ${PYTHON_IMAGE} AS os
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH
# gcc + libc6-dev + Python's headers: Triton compiles a small C launcher on first use of each
# kernel ("Failed to find C compiler" otherwise); a python:*-slim image has the headers,
# Debian's Python needs python3-dev. ffmpeg: shared FFmpeg libraries for torchcodec (a vLLM
# dependency) and the ffprobe/ffmpeg CLI.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev ffmpeg ca-certificates \
 && if ! command -v python3 >/dev/null; then \
      apt-get install -y --no-install-recommends python3 python3-venv; fi \
 && if ! python3 -c "import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))"; then \
      apt-get install -y --no-install-recommends python3-dev; fi \
 && rm -rf /var/lib/apt/lists/*

# ---- deps: the locked set (vLLM's CUDA build, its torch, the app), hashes checked -----------
# This layer is most of the image (several GB of CUDA wheels) and depends only on the base and
# lock-gpu.txt, so the app's code, the CPU lock and the settings below never invalidate it:
# a rebuild with an unchanged lock takes it from Docker's build cache.
FROM os AS deps
# requirements/lock-gpu.txt is written by scripts/lock.sh from gpu.txt and app.txt for Python
# 3.11: every package pinned with its sha256, so a rebuild installs exactly what was locked.
COPY requirements/lock-gpu.txt /opt/requirements/lock-gpu.txt
RUN --mount=type=secret,id=ca_bundle \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
 && python3 -m venv /opt/venv \
 && pip install --no-cache-dir --require-hashes --no-deps -r /opt/requirements/lock-gpu.txt \
 && pip check

# ---- runtime: built on deps, not a copy of its venv (a second multi-GB layer) ---------------
FROM deps AS runtime
# Same uid/gid as the CPU image: both read and write the shared media volume.
RUN groupadd --system --gid 10001 vidlora \
 && useradd --system --uid 10001 --gid vidlora --home-dir /home/vidlora --create-home \
      --shell /usr/sbin/nologin vidlora \
 && mkdir -p /srv/vidlora/media /var/lib/vidlora /etc/vidlora /home/vidlora/.cache \
 && chown vidlora:vidlora /srv/vidlora/media /var/lib/vidlora /home/vidlora/.cache
WORKDIR /app
# Editable install so vidlora's PROJECT_ROOT is /app (alembic.ini, migrations/, scenarios.yaml).
COPY . /app
# --no-build-isolation: the locked setuptools in the venv builds it, so this step needs no index.
RUN pip install --no-cache-dir --no-deps --no-build-isolation -e . \
 && chmod 0755 docker/boot.sh
# What the nvidia/cuda base images set: the NVIDIA container runtime mounts the host's driver
# (compute: libcuda; utility: nvidia-smi, NVML) and refuses to start the container on a driver
# older than NVIDIA_REQUIRE_CUDA. 13.0 is the CUDA of the locked torch (nvidia-cuda-runtime
# in lock-gpu.txt; a test keeps the two equal). No brand/driver ranges: those admit older
# datacenter drivers through the cuda-compat package, which this image does not carry.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    NVIDIA_REQUIRE_CUDA="cuda>=13.0"
# Weights and adapters come from read-only mounts; nothing is fetched from a hub at run time.
# Compile caches (Triton, torch.compile, vLLM) live under ~/.cache, a volume in compose, so
# a restarted worker skips most of its warm-up.
ENV VIDLORA_VAR_DIR=/var/lib/vidlora \
    VIDLORA_MEDIA_ROOT=/srv/vidlora/media \
    VIDLORA_METRICS_PORT=9100 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HF_HOME=/home/vidlora/.cache/huggingface \
    VLLM_CACHE_ROOT=/home/vidlora/.cache/vllm \
    TRITON_CACHE_DIR=/home/vidlora/.cache/triton \
    VLLM_NO_USAGE_STATS=1 \
    DO_NOT_TRACK=1
USER 10001:10001
# Healthy once it can serve (metrics on 9100 by default, above): the worker starts its metrics
# server only after the engine is up and every adapter is registered (tasks/gpu_worker.py), so
# `docker compose up --wait` waits for a worker that takes batches. Engine start with CUDA
# graphs takes minutes.
HEALTHCHECK --interval=15s --timeout=10s --start-period=15m --retries=3 \
  CMD ["sh", "-c", "exec python /app/docker/healthcheck.py http://127.0.0.1:${VIDLORA_METRICS_PORT:-9100}/metrics"]
CMD ["vidlora", "worker", "gpu"]
