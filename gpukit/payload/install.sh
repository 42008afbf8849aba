#!/usr/bin/env bash
# Install the carried vLLM >= 0.27 wheel set (build.sh beside this file) on the offline H200.
# Run from a folder that holds ALL chunk files payload.tar.xz.part-* and SHA256SUMS (recv.sh
# gathers them in ${TMPDIR:-/tmp}/chunks), or the *.whl files themselves.
# The payload is a concatenation of per-wheel tar.xz streams: unpacked with xz -dc | tar -xi.
# Result: packages in $SITE (default ${TMPDIR:-/tmp}/site). Then:
#   export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}   (export it: the EngineCore is a child)
# With torch carried (mode full) the image's nvidia-* CUDA 13 libraries are used (torch finds
# them on sys.path); their cuDNN 9.19 is older than the 9.20 torch 2.13 was built with, so set
#   export PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1
set -euo pipefail
SITE=${SITE:-${TMPDIR:-/tmp}/site}
WIN=${WIN:-${TMPDIR:-/tmp}/wheels_in_v27}
HERE=$(pwd)
t0=$(date +%s)
if ls payload.tar.xz.part-* >/dev/null 2>&1; then
  [ -f SHA256SUMS ] || { echo "SHA256SUMS missing" >&2; exit 1; }
  want=$(wc -l < SHA256SUMS); have=$(ls payload.tar.xz.part-* | wc -l)
  [ "$want" = "$have" ] || { echo "have $have of $want chunks: $(ls payload.tar.xz.part-* | tr '\n' ' ')" >&2; exit 3; }
  sha256sum -c --quiet SHA256SUMS
  echo "reassembling $have chunks"
  rm -rf "$WIN"; mkdir -p "$WIN"
  if command -v xz >/dev/null 2>&1; then
    cat payload.tar.xz.part-* | xz -dc -T0 | tar -xi -C "$WIN"
  else
    python3 - "$WIN" <<'PY'
import glob, io, lzma, sys, tarfile
data = lzma.decompress(b"".join(open(p, "rb").read() for p in sorted(glob.glob("payload.tar.xz.part-*"))))
tarfile.open(fileobj=io.BytesIO(data), ignore_zeros=True).extractall(sys.argv[1])
PY
  fi
  cd "$WIN"
fi
ls ./*.whl
# integrity: every file inside every wheel must match the sha256 in that wheel's RECORD
python3 - <<'PY'
import zipfile, glob, hashlib, base64, csv, io, sys
bad = 0
for w in sorted(glob.glob('*.whl')):
    z = zipfile.ZipFile(w)
    rec = [n for n in z.namelist() if n.endswith('.dist-info/RECORD')][0]
    for row in csv.reader(io.StringIO(z.read(rec).decode())):
        if len(row) < 2 or not row[1]: continue
        algo, want = row[1].split('=', 1)
        got = base64.urlsafe_b64encode(hashlib.new(algo, z.read(row[0])).digest()).rstrip(b'=').decode()
        if got != want: bad += 1; print('HASH MISMATCH', w, row[0])
print('RECORD check:', 'OK' if not bad else f'{bad} mismatches'); sys.exit(1 if bad else 0)
PY
mkdir -p "$SITE"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" ./*.whl
cd "$HERE"
rm -rf "$WIN"
echo "installed into $SITE in $(( $(date +%s) - t0 )) s:"; ls "$SITE" | grep -i dist-info | sed 's/.dist-info//' | tr '\n' ' '; echo
# torch 2.13's libtorch_cuda names 8 functions of NCCL 2.29 the image's NCCL 2.28 lacks (plan.md);
# Python dlopens extensions with RTLD_NOW, so without this `import torch` fails with "undefined
# symbol: ncclCommResume" (seen on the H200, 2026-12-01). Lazy binding resolves a function at its
# first call, and a single-GPU engine never calls these. Every process with $SITE on its path
# runs this (the engine core child too).
cat > "$SITE/sitecustomize.py" <<'PY'
import os
import sys

sys.setdlopenflags(os.RTLD_LAZY)
PY
# smoke test: versions, one ATen CUDA kernel (a pruned fatbin must still load), one Triton kernel
# Written to a file: Triton 3.8 refuses @jit functions it cannot read the source of (stdin).
SMOKE=$SITE/.payload_smoke_test.py
cat > "$SMOKE" <<'PY'
import torch, triton, triton.language as tl, subprocess, os
print("torch", torch.__version__, "from", os.path.dirname(torch.__file__), "| cuda", torch.version.cuda,
      "| cudnn", torch.backends.cudnn.version(), "| triton", triton.__version__)
from triton.backends.nvidia.compiler import get_ptxas
print("ptxas(sm_90):", subprocess.check_output([get_ptxas(90).path, "--version"]).decode().strip().splitlines()[-2])
x = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
y = (x @ x).float().softmax(-1).sum()
torch.cuda.synchronize(); print("aten matmul+softmax ok:", float(y))
@triton.jit
def add(X, Y, N: tl.constexpr):
    i = tl.arange(0, N); tl.store(Y + i, tl.load(X + i) * 2)
a = torch.arange(128, device="cuda", dtype=torch.float32); b = torch.empty_like(a)
add[(1,)](a, b, N=128); torch.cuda.synchronize(); print("triton kernel ok:", bool((b == 2 * a).all()))
try:
    import vllm, vllm._C_stable_libtorch  # noqa
    print("vllm", vllm.__version__, "ops loaded from", os.path.dirname(vllm.__file__))
except Exception as e:
    print("vllm import FAILED:", repr(e))
# vLLM 0.34's Qwen3.5 model on CUDA calls flashinfer.norm in every RMSNorm (issue 57): its kernels
# are JIT-compiled with the image's nvcc on first use, so time that here, before any engine.
import importlib.util, time
if importlib.util.find_spec("flashinfer"):
    try:
        t = time.time()
        import flashinfer
        from flashinfer.norm import gemma_rmsnorm
        h = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
        out = gemma_rmsnorm(h, torch.zeros(256, device="cuda", dtype=torch.bfloat16), 1e-6)
        torch.cuda.synchronize()
        print("flashinfer", flashinfer.__version__, "gemma_rmsnorm ok:", bool(torch.isfinite(out).all()),
              f"in {time.time() - t:.1f} s (JIT compile included)")
    except Exception as e:
        print("flashinfer norm FAILED:", repr(e))
PY
PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1 python3 "$SMOKE" || echo "SMOKE TEST FAILED (see above)"
cat <<MSG

Now run:
  export PYTHONPATH=$SITE\${PYTHONPATH:+:\$PYTHONPATH}
  export VLLM_USE_FLASHINFER_SAMPLER=0 PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1
  python3 your_script.py        # pass gdn_prefill_backend="triton" to LLM(...)
MSG
