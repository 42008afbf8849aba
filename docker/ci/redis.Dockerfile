# Redis for the CI stack, from Debian's packages on the local base image (no registry to pull
# redis:7 from). compose runs `redis-server ...` in /data, as with the official image.
ARG BASE_IMAGE=vidlora-ci-base:bookworm
FROM ${BASE_IMAGE}
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /data && chown redis:redis /data
WORKDIR /data
USER redis
EXPOSE 6379
CMD ["redis-server"]
