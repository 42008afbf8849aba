#!/usr/bin/env bash
# Build the payload that carries vLLM >= 0.27 (CUDA 13) to the offline GPU machine, whose image
# has torch 2.11.0+cu130, Triton 3.6.0 and Python 3.12 (plan.md beside this file: sizes, calls, cost).
# What it carries is the production lock's (issue 57): requirements/lock-gpu.txt when it pins
# VLLM_VERSION, else the lock scripts/lock.sh writes for that version (same inputs, that vllm
# line), less what carry.py leaves to the image or skips (carry-rules.txt, device-image.txt).
# So the device runs the versions the GPU image runs, structured-output backends included.
#
# Usage (from the repo root):  bash gpukit/payload/build.sh [OUTDIR] [MODE...]
#   OUTDIR  default .gpu-payload-v27 (git-ignored)
#   MODE    full       vLLM + the torch it pins + that torch's triton + torchvision + deps  (default)
#           vllm-only  vLLM + deps + the triton of vLLM's torch; runs on the image's torch 2.11
#                      (vLLM's compiled ops need no symbol torch 2.11 lacks: plan.md)
#           over       vLLM + the deps whose pins differ from BASE_VLLM's lock: installs over
#                      BASE_VLLM's `full` payload (same torch/torchvision/triton, checked here)
#           triton     only that triton wheel: pair with the shared 0.26 payload to change
#                      Triton alone (3.6.0 -> 3.7.1)
# Env: VLLM_VERSION (default: the vllm pin of requirements/lock-gpu.txt), LOCK (a lock file to
#      use instead), BASE_VLLM (mode over: the release whose full payload is installed first;
#      BASE=OUTDIR/full/MANIFEST.txt instead: leave out only the wheels that payload really has),
#      PRUNE_SM (default 90: keep only sm_90 cubins in every fatbin; PRUNE_SM= to keep
#      all), CHUNK (default 60000000 bytes), XZ_T (xz threads, default 2), TRITON (override the
#      triton version; TRITON=none with vllm-only keeps the image's Triton 3.6.0), KEEP_MOE (1: keep vLLM's MoE ops for a MoE base; use its own OUTDIR, the caches do not know it), KEEP (0: delete
#      downloads and stage at the end; default 1. The per-wheel .tar.xz are cached either way),
#      DRY (1: download and list what the modes would carry, raw wheel sizes; no slim, no xz).
# Result: OUTDIR/MODE/payload.tar.xz.part-aa..  SHA256SUMS  install.sh  MANIFEST.txt  calls.txt
#         OUTDIR/carry.txt (carry.py --explain: each locked package and why it travels or not)
#         (OUTDIR/vllm-only-image-triton/ for TRITON=none)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${1:-.gpu-payload-v27}; shift || true
MODES=${*:-full}
REPO=$(cd "$HERE/../.." && pwd)
VLLM_VERSION=${VLLM_VERSION:-$(sed -n 's/^vllm==\([^ ]*\).*/\1/p' "$REPO/requirements/lock-gpu.txt")}
PRUNE_SM=${PRUNE_SM-90}
CHUNK=${CHUNK:-60000000}
XZ_T=${XZ_T:-2}
XZ_LEVEL=${XZ_LEVEL:-9e}   # -3: ~4x faster on a busy 2-core machine, ~15 % larger
KEEP=${KEEP:-1}
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_18_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
dl() {  # dl SPEC... : download into $OUT/wheels (no deps, cp312 manylinux, like shared/gpu/build_payload.sh)
  PIP_CONSTRAINT= python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${PLAT[@]}" -d "$OUT/wheels" "$@" 2> >(grep -v "is ignored: it is neither" >&2)
}
whl() { ls "$OUT"/wheels/"$1"-*.whl 2>/dev/null | head -1 || true; }   # whl DIST_PREFIX (as in file names)
req() {  # req WHEEL NAME : the version NAME is pinned to (== or ~=) in WHEEL's METADATA
  python3 - "$1" "$2" <<'PY'
import re, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
for l in z.read(meta).decode().splitlines():
    m = re.match(r"Requires-Dist: *%s *\(?(?:==|~=) *([^;,) ]+)" % re.escape(sys.argv[2]), l, re.I)
    if m and "extra ==" not in l:
        print(m.group(1)); break
PY
}
lock_for() {  # lock_for VERSION : the GPU image's lock with that vLLM (the committed one, or written to $OUT)
  if grep -qE "^vllm==$1( |$)" "$REPO/requirements/lock-gpu.txt"; then echo "$REPO/requirements/lock-gpu.txt"; return; fi
  local f="$OUT/lock-gpu-$1.txt"
  [ -s "$f" ] || (cd "$REPO" && GPU_VLLM=$1 GPU_LOCK_OUT="$f" bash scripts/lock.sh gpu >&2)
  echo "$f"
}
pin() { sed -n "s/^$2==\([^ ]*\).*/\1/p" "$1"; }   # pin LOCK NAME
wheels_for() {  # wheels_for PINFILE : the downloaded wheel of each name==version line
  while read -r line; do
    name=${line%%==*}; ver=${line#*==}
    f=$(ls "$OUT"/wheels/ | grep -i "^$(echo "$name" | tr '-' '_' | sed 's/\./_/g')-$ver-" | head -1)
    [ -n "$f" ] || { echo "missing wheel for $line" >&2; exit 1; }
    echo "$OUT/wheels/$f"
  done < "$1"
}
mkdir -p "$OUT/wheels"
LOCK=${LOCK:-$(lock_for "$VLLM_VERSION")}
[ "$(pin "$LOCK" vllm)" = "$VLLM_VERSION" ] || { echo "$LOCK does not pin vllm==$VLLM_VERSION" >&2; exit 2; }
python3 "$HERE/carry.py" "$LOCK" --explain > "$OUT/carry.txt"
python3 "$HERE/carry.py" "$LOCK" > "$OUT/carry-pins.txt"
echo "== download (vllm $VLLM_VERSION; lock $LOCK: $(grep -c '^carry' "$OUT/carry.txt") packages carried, $(grep -c '^image' "$OUT/carry.txt") from the image, $(grep -c '^skip' "$OUT/carry.txt") skipped)"
dl "vllm==$VLLM_VERSION"
V=$(whl "vllm-$VLLM_VERSION")
TORCH_V=$(pin "$LOCK" torch); TV_V=$(pin "$LOCK" torchvision)
FULL=0; [[ " $MODES " != *" full "* ]] || FULL=1
[ $FULL = 0 ] || dl "torch==$TORCH_V"
T=$(whl "torch-$TORCH_V")
TRITON_SPEC=${TRITON:-$(pin "$LOCK" triton)}
echo "lock: torch==$TORCH_V torchvision==$TV_V triton==$(pin "$LOCK" triton) (vllm pins torch==$(req "$V" torch)); carrying triton $TRITON_SPEC"
[ $FULL = 0 ] || dl "torchvision==$TV_V"
[ "$TRITON_SPEC" = none ] || [ "$MODES" = over ] || dl "triton==$TRITON_SPEC"
dl -r "$OUT/carry-pins.txt"
TR=$( [ "$TRITON_SPEC" = none ] || whl "triton-$TRITON_SPEC"); TVW=$(whl "torchvision-$TV_V")
mapfile -t COMMON < <(wheels_for "$OUT/carry-pins.txt")
OVER=()
if [[ " $MODES " == *" over "* ]]; then
  [ -n "${BASE_VLLM:-}${BASE:-}" ] || { echo "mode over needs BASE_VLLM (the release whose full payload is installed) or BASE (its MANIFEST.txt)" >&2; exit 2; }
  BASE_LOCK=${BASE:-$(lock_for "$BASE_VLLM")}
  for n in torch torchvision triton; do
    b=$(python3 "$HERE/carry.py" "$BASE_LOCK" --pin $n)
    [ "$(pin "$LOCK" $n)" = "$b" ] || { echo "over: $n differs from the base's ($(pin "$LOCK" $n) vs $b, $BASE_LOCK): build full" >&2; exit 2; }
  done
  python3 "$HERE/carry.py" "$LOCK" --base "$BASE_LOCK" > "$OUT/over-pins.txt"
  mapfile -t OVER < <(wheels_for "$OUT/over-pins.txt")
fi

STAGE="$OUT/stage-sm${PRUNE_SM:-all}"; XZD="$OUT/xz-sm${PRUNE_SM:-all}"
mkdir -p "$STAGE" "$XZD"
ALL=("$V" ${OVER[@]+"${OVER[@]}"})  # what the modes asked for select from
[ "$MODES" = over ] || [ "$MODES" = triton ] || ALL+=("${COMMON[@]}")
[[ " $MODES " != *" full "* ]] || ALL+=("$T" "$TVW")
[ -z "$TR" ] || [[ " $MODES " != *" full "* && " $MODES " != *" vllm-only "* && " $MODES " != *" triton "* ]] || ALL+=("$TR")
mapfile -t ALL < <(printf '%s\n' "${ALL[@]}" | awk '!seen[$0]++')
if [ "${DRY:-0}" = 1 ]; then  # what would travel, as downloaded wheels; nothing slimmed or compressed
  for w in "${ALL[@]}"; do echo "$(stat -c %s "$w") $(basename "$w")"; done | sort -rn | tee "$OUT/dry-run.txt"
  echo "$(awk '{s+=$1} END {print s}' "$OUT/dry-run.txt") bytes of wheels in ${#ALL[@]} files"; exit 0
fi
echo "== slim ($( [ -n "$PRUNE_SM" ] && echo "fatbins pruned to sm_$PRUNE_SM" || echo "fatbins untouched"))"
python3 "$HERE/slim.py" "$STAGE" "${ALL[@]}" ${PRUNE_SM:+--prune-sm "$PRUNE_SM"} --report "$STAGE/prune-report.tsv"
echo "== xz -${XZ_LEVEL:-9e} -T$XZ_T each staged wheel (cached in $XZD)"
for w in "${ALL[@]}"; do
  b=$(basename "$w")
  if [ ! -s "$XZD/$b.tar.xz" ]; then
    s=$(date +%s)
    tar -C "$STAGE" -cf - --owner=0 --group=0 "$b" | xz -${XZ_LEVEL:-9e} -T"$XZ_T" > "$XZD/$b.tar.xz.tmp"
    mv "$XZD/$b.tar.xz.tmp" "$XZD/$b.tar.xz"
    echo "  $b: $(stat -c %s "$w") raw wheel, $(stat -c %s "$STAGE/$b") staged, $(stat -c %s "$XZD/$b.tar.xz") xz ($(( $(date +%s) - s )) s)"
  fi
done

for MODE in $MODES; do
  case $MODE in
    full)      [ -n "$TR" ] || { echo "full needs a triton" >&2; exit 2; }; SEL=("$V" "$T" "$TR" "$TVW" "${COMMON[@]}") ;;
    vllm-only) SEL=("$V" ${TR:+"$TR"} "${COMMON[@]}") ;;
    over)      SEL=("$V" ${OVER[@]+"${OVER[@]}"}) ;;
    triton)    [ -n "$TR" ] || { echo "triton mode needs a triton" >&2; exit 2; }; SEL=("$TR") ;;
    *) echo "unknown mode $MODE" >&2; exit 2 ;;
  esac
  D="$OUT/$MODE$( [ "$TRITON_SPEC" != none ] || echo -image-triton)"; rm -rf "$D"; mkdir -p "$D"
  # concatenated xz streams of concatenated tars: install.sh unpacks with xz -dc | tar -xi
  for w in "${SEL[@]}"; do cat "$XZD/$(basename "$w").tar.xz"; done > "$D/payload.tar.xz"
  (cd "$D" && split -b "$CHUNK" -a 2 payload.tar.xz payload.tar.xz.part- && rm payload.tar.xz \
     && sha256sum payload.tar.xz.part-* > SHA256SUMS)
  cp "$HERE/install.sh" "$D/install.sh"
  {
    echo "mode=$MODE vllm=$VLLM_VERSION torch=$(case $MODE in full) echo "$TORCH_V";; over) echo "$TORCH_V (vllm ${BASE_VLLM:-}'s full payload)";; *) echo "image 2.11.0";; esac) triton=$TRITON_SPEC prune_sm=${PRUNE_SM:-none} chunk=$CHUNK lock=$(basename "$LOCK")"
    [ -z "$TR" ] || echo "ptxas (sm_90) bundled with triton $TRITON_SPEC: $(unzip -p "$TR" triton/backends/nvidia/bin/ptxas > "$OUT/.ptxas" && chmod +x "$OUT/.ptxas" && "$OUT/.ptxas" --version | grep release; rm -f "$OUT/.ptxas")"
    for w in "${SEL[@]}"; do b=$(basename "$w"); echo "$b raw=$(stat -c %s "$w") staged=$(stat -c %s "$STAGE/$b") xz=$(stat -c %s "$XZD/$b.tar.xz")"; done
    echo "total_xz=$(cat "$D"/payload.tar.xz.part-* | wc -c) chunks=$(ls "$D"/payload.tar.xz.part-* | wc -l)"
  } > "$D/MANIFEST.txt"
  python3 "$HERE/calls.py" "$D" > "$D/calls.txt"
  echo "== $MODE"; cat "$D/MANIFEST.txt"; ls -la "$D"
done
if [ "$KEEP" = 0 ]; then rm -rf "$OUT/wheels" "$STAGE"; fi
