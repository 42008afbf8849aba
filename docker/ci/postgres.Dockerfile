# PostgreSQL for the CI stack, from Debian's packages on the local base image (CI has no
# registry to pull postgres:16 from). It honours what compose gives the official image:
# POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB and a data volume at /var/lib/postgresql/data.
# Production uses the official image (docker-compose.yml); only docker/compose.ci.yml uses this.
ARG BASE_IMAGE=vidlora-ci-base:bookworm
FROM ${BASE_IMAGE}
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends postgresql-15 \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /var/lib/postgresql/data /run/postgresql \
 && chown -R postgres:postgres /var/lib/postgresql /run/postgresql
ENV PATH=/usr/lib/postgresql/15/bin:$PATH \
    PGDATA=/var/lib/postgresql/data
COPY postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
USER postgres
# Fast shutdown, as the official image: SIGTERM would wait for every client to leave.
STOPSIGNAL SIGINT
EXPOSE 5432
ENTRYPOINT ["/usr/local/bin/postgres-entrypoint.sh"]
