#!/usr/bin/env bash
# Runs on the lent H200 (see bench/gpu/README.md). Usage: bash bench/gpu/device_run.sh STAGE [BUDGET_S]
#   STAGE: main     assets + the 27B-shape engine (graphs, engine_patch on): ratios, memory, swaps
#          patchoff the same engine without engine_patch; then tiny-model verify + fault injection
#          eager    the 27B-shape engine with enforce_eager (engine_patch on)
#          tiny     tiny-model verify (patch on / off) + fault injection only
#          adapters issue 11: forced-rebuild fault run (patch on, off), verify to 32k tokens,
#                   verify video mode (both through the worker's adapter registration)
# Results go to $SCRATCH/res (SCRATCH: the device's temporary folder) and are packed into $OUT/res-STAGE.tgz every 15 s and at the end,
# so a command cut off at its limit still returns what it measured.
set -u
STAGE=${1:-main}
BUDGET=${2:-560}
T0=$(date +%s)
END=$((T0 + BUDGET))
REPO=$(pwd)
# The carried payload installs into $TMPDIR/site (the shared GPU notes); scratch lives beside it.
SCRATCH=${TMPDIR:-/tmp}
RES=$SCRATCH/res
mkdir -p $RES
export PYTHONPATH=$SCRATCH/site:$REPO PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 \
       VLLM_ENABLE_V1_MULTIPROCESSING=0 TOKENIZERS_PARALLELISM=false
GPUKW='{"gdn_prefill_backend": "triton"}'
VIDEO_ARGS=${VIDEO_ARGS:-"--video $REPO/var/verify-frames"}
# verify builds several engines in one process: small ones, so each finds room (closed
# in-process engines did not always give their memory back on 0.26).
VERIFYKW='{"gdn_prefill_backend": "triton", "gpu_memory_utilization": 0.15}'
# 20 rank-64 adapters are ~19 GB: tmpfs if it has room (fast reads), else $SCRATCH.
ASSETS=/dev/shm/vl
[ "$(df -BG --output=avail /dev/shm 2>/dev/null | tail -1 | tr -dc 0-9)" -gt 30 ] 2>/dev/null || ASSETS=$SCRATCH/vl
left() { local l=$((END - $(date +%s))); [ $l -lt 6 ] && l=6; echo $l; }
pack() { tar czf $OUT/.res.tgz -C $SCRATCH res 2>/dev/null && mv $OUT/.res.tgz $OUT/res-$STAGE.tgz; }
( while sleep 15; do pack; done ) & PACKER=$!
log() { echo "[device $(date +%H:%M:%S) left=$(left)s] $*" | tee -a $RES/device.log; }

nvidia-smi > $RES/nvidia-smi-$STAGE.txt 2>&1
python3 -c "import vllm, torch, triton; print(vllm.__version__, torch.__version__, triton.__version__)" 2>&1 | tail -1 | tee -a $RES/device.log

assets() {
  if [ ! -f $ASSETS/assets.json ]; then
    log "assets"
    python3 -m bench.gpu.assets --out $ASSETS --adapters 20 > $RES/assets.log 2>&1 || log "assets FAILED"
    tail -1 $RES/assets.log
  fi
}

bench() {  # label patch eager phases
  local label=$1 patch=$2 eager=$3 phases=$4 extra=""
  [ "$eager" = 1 ] && extra="--eager"
  log "bench $label"
  timeout $(( $(left) - 5 )) python3 -m bench.gpu.bench_engine --assets $ASSETS --label $label \
    --json $RES/$label.json --patch $patch $extra --phases $phases --llm-kwargs "$GPUKW" \
    --deadline $((END - 10)) --min-phase-s 20 > $RES/$label.log 2>&1
  log "bench $label rc=$?"
  grep "\[bench" $RES/$label.log | cut -c1-260
}

fault() {  # patch
  log "fault $1"
  timeout $(( $(left) - 5 )) python3 -m bench.gpu.fault --tiny $REPO/var/tiny-model --work $SCRATCH/vl-fault \
    --json $RES/fault_$1.json --patch $1 --llm-kwargs "$GPUKW" > $RES/fault_$1.log 2>&1
  log "fault $1 rc=$?"; tail -1 $RES/fault_$1.log
}

verify() {  # patch(on/off)
  local np=""; [ "$1" = off ] && np="--no-patch"
  log "verify $1"
  local A=$REPO/var/tiny-model/adapters
  timeout $(( $(left) - 5 )) python3 -m engine_patch.verify --model $REPO/var/tiny-model/base \
    --adapter $A/artifact_identification --adapter $A/murals_inscriptions --adapter $A/tomb_structure \
    --lengths 16,127,128,129,450,1024,2048,4096,8192 --json $RES/verify_$1.json $np \
    --llm-kwargs "$GPUKW" --workdir $SCRATCH/verify_$1 > $RES/verify_$1.log 2>&1
  log "verify $1 rc=$?"; tail -5 $RES/verify_$1.log | cut -c1-300
}

rebuild() {  # patch(on/off)
  log "rebuild $1"
  timeout $(( $(left) - 5 )) python3 -m bench.gpu.rebuild --tiny $REPO/var/tiny-model --work $SCRATCH/rebuild_$1 \
    --json $RES/rebuild_$1.json --patch $1 --utilization 0.3 --llm-kwargs "$GPUKW" > $RES/rebuild_$1.log 2>&1
  log "rebuild $1 rc=$?"; tail -1 $RES/rebuild_$1.log | cut -c1-400
}

verify_long() {  # one adapter, text prompts to 32k tokens
  log "verify long"
  local A=$REPO/var/tiny-model/adapters
  timeout $(( $(left) - 5 )) python3 -m engine_patch.verify --model $REPO/var/tiny-model/base \
    --adapter $A/artifact_identification --lengths 16,450,2048,8192,16384,32704 --max-new-tokens 16 --checks a,c \
    --json $RES/verify_long.json --llm-kwargs "$VERIFYKW" --workdir $SCRATCH/verify_long > $RES/verify_long.log 2>&1
  log "verify long rc=$?"; tail -4 $RES/verify_long.log | cut -c1-300
}

verify_video() {
  log "verify video"
  local A=$REPO/var/tiny-model/adapters
  timeout $(( $(left) - 5 )) python3 -m engine_patch.verify --model $REPO/var/tiny-model/base \
    --adapter $A/artifact_identification --adapter $A/tomb_structure $VIDEO_ARGS --max-new-tokens 16 \
    --json $RES/verify_video.json --llm-kwargs "$VERIFYKW" --workdir $SCRATCH/verify_video > $RES/verify_video.log 2>&1
  log "verify video rc=$?"; tail -4 $RES/verify_video.log | cut -c1-300
}

MAIN_PHASES=warmup,bare_nolora,bare_one,bare_mixed3,host_mixed3,bare_grouped3,host_grouped3,adapters20,prefill_nolora,prefill_one,profile,bare_nolora_repeat,bare_sorted3,prefill_mixed3
case $STAGE in
  main)
    assets
    bench graphs_patch on 0 $MAIN_PHASES
    [ $(left) -gt 100 ] && fault off
    [ $(left) -gt 80 ] && fault on
    ;;
  patchoff)
    assets
    bench graphs_nopatch off 0 warmup,bare_nolora,bare_one,bare_mixed3,prefill_one,prefill_nolora,bare_nolora_repeat
    [ $(left) -gt 200 ] && [ -f $REPO/engine_patch/verify.py ] && verify on
    [ $(left) -gt 90 ] && [ ! -f $RES/fault_off.json ] && fault off
    [ $(left) -gt 90 ] && [ ! -f $RES/fault_on.json ] && fault on
    [ $(left) -gt 200 ] && bench eager_patch on 1 warmup,bare_nolora,bare_one,bare_mixed3,prefill_one
    ;;
  eager)
    assets
    bench eager_patch on 1 warmup,bare_nolora,bare_one,bare_mixed3,prefill_one,bare_nolora_repeat
    ;;
  adapters)
    rebuild on
    [ $(left) -gt 120 ] && rebuild off
    [ $(left) -gt 150 ] && verify_long
    ;;
  long)
    verify_long
    ;;
  fault)
    fault on
    [ $(left) -gt 120 ] && fault off
    ;;
  video)
    verify_video
    ;;
  tiny)
    [ -f $REPO/engine_patch/verify.py ] && verify on
    [ $(left) -gt 200 ] && [ -f $REPO/engine_patch/verify.py ] && verify off
    [ $(left) -gt 90 ] && fault off
    [ $(left) -gt 90 ] && fault on
    ;;
esac
log "done"
kill $PACKER 2>/dev/null
pack
ls -la $RES
