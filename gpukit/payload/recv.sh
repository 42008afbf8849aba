#!/usr/bin/env bash
# Device side, one line per call: stash one carried chunk in ${TMPDIR:-/tmp}/chunks and say what is there.
#   bash gpukit/payload/recv.sh DIR PART            # calls 1..N-1
#   bash gpukit/payload/recv.sh DIR PART --install  # call N: stash, then install.sh
# DIR is the carried mode folder (e.g. .gpu-payload-v27/full), PART a chunk name in it
# (payload.tar.xz.part-ab). Carry DIR/PART and DIR/SHA256SUMS with every call; this script and
# install.sh travel with the work tree.
# Env: CHUNKS (default ${TMPDIR:-/tmp}/chunks; another folder per payload), SITE (install target),
#      BASE_SITE (mode over: SITE starts as a copy of this install, e.g. the 0.33 full payload's).
# Exit 0: chunk stored (and installed, with --install). Exit 3: an earlier chunk is missing, i.e.
# this is a fresh machine (the previous one was given back): start again at call 1.
set -euo pipefail
DIR=$1; PART=$2; MODE=${3:-}
HERE=$(cd "$(dirname "$0")" && pwd)
CH=${CHUNKS:-${TMPDIR:-/tmp}/chunks}
SITE=${SITE:-${TMPDIR:-/tmp}/site}
mkdir -p "$CH"
cp "$DIR/SHA256SUMS" "$CH/SHA256SUMS"
cp "$DIR/$PART" "$CH/$PART"
(cd "$CH" && grep " $PART\$" SHA256SUMS | sha256sum -c --quiet -) || { echo "chunk $PART corrupt" >&2; exit 1; }
missing=$(cd "$CH" && awk '{print $2}' SHA256SUMS | while read -r p; do [ -f "$p" ] || echo "$p"; done)
before=$(echo "$missing" | awk -v p="$PART" 'NF && $1 < p')
echo "stored $PART; have $(ls "$CH"/payload.tar.xz.part-* | wc -l)/$(wc -l < "$CH/SHA256SUMS"); missing: $(echo ${missing:-none})"
if [ -n "$before" ]; then echo "FRESH MACHINE: earlier chunks missing ($(echo $before)): start again at call 1"; exit 3; fi
if [ "$MODE" = --install ]; then
  [ -z "$missing" ] || { echo "cannot install, missing: $missing" >&2; exit 3; }
  stamp=$(sha256sum "$CH/SHA256SUMS" | cut -c1-16)
  if [ -f "$SITE/.payload_v27_$stamp" ]; then echo "already installed in $SITE (machine was warm)"; exit 0; fi
  # BASE_SITE: install over a copy of another release's install (mode over: same torch/triton)
  if [ -n "${BASE_SITE:-}" ] && [ ! -d "$SITE" ]; then cp -a "$BASE_SITE" "$SITE"; fi
  (cd "$CH" && SITE=$SITE bash "$HERE/install.sh")
  touch "$SITE/.payload_v27_$stamp"
fi
