#!/usr/bin/env bash
# One-shot start-up step for the `migrate` service: bring the schema to head (and sync
# scenarios) with `vidlora db upgrade`, retrying while PostgreSQL is still coming up, then
# either exit (no arguments) or exec the given command.
#
# Compose already waits for pg_isready, but a fresh volume restarts PostgreSQL once after
# initdb and a remote database may be briefly unreachable, so a few retries remain useful.
# It also refuses the placeholder secrets of .env.example: every app service depends on
# `migrate` completing, so a stack still configured with them never starts.
set -euo pipefail

attempts=${BOOT_DB_ATTEMPTS:-20}
delay=${BOOT_DB_DELAY_S:-3}

if [ "${VIDLORA_ALLOW_PLACEHOLDER_SECRETS:-0}" != "1" ]; then
  for var in VIDLORA_SECRET_KEY POSTGRES_PASSWORD REDIS_PASSWORD FLOWER_BASIC_AUTH; do
    value=${!var-}
    case "$value" in
      *change-me*)
        echo "boot: $var still has the placeholder value from .env.example; set a real one in .env" >&2
        exit 78  # EX_CONFIG
        ;;
    esac
  done
fi

n=1
until vidlora db upgrade; do
  if [ "$n" -ge "$attempts" ]; then
    echo "boot: 'vidlora db upgrade' failed $n times; giving up" >&2
    exit 1
  fi
  echo "boot: database not ready (attempt $n/$attempts); retrying in ${delay}s" >&2
  n=$((n + 1))
  sleep "$delay"
done

if [ "$#" -gt 0 ]; then
  exec "$@"
fi
