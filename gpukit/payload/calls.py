"""Print the device calls that carry one built payload (build.sh runs this into MODE/calls.txt).

usage: python3 gpukit/payload/calls.py .gpu-payload-v27/full [--run 'CMD'] [--carry PATH...]
One JSON object a line: {"call": k, "carry": [...], "command": "..."} for the device tool's run.
Issue them back to back: the machine is given back after 30 s idle, so have the next call ready
before reading the previous one's output. A call that exits 3 found a fresh machine: restart at 1.
The last call installs (install.sh, ~1 min for torch: see plan.md) and then runs --run CMD;
--carry adds your own ignored assets to that last call (its chunk is the smallest one).
"""
import argparse, json, os

ap = argparse.ArgumentParser()
ap.add_argument("dir")
ap.add_argument("--run", default="")
ap.add_argument("--carry", nargs="*", default=[])
a = ap.parse_args()
d = a.dir.rstrip("/")
parts = sorted(p for p in os.listdir(d) if p.startswith("payload.tar.xz.part-"))
recv = "bash gpukit/payload/recv.sh"
env = ("export PYTHONPATH=${TMPDIR:-/tmp}/site${PYTHONPATH:+:$PYTHONPATH} VLLM_USE_FLASHINFER_SAMPLER=0 "
       "PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1")
for k, p in enumerate(parts, 1):
    last = k == len(parts)
    carry = [f"{d}/{p}", f"{d}/SHA256SUMS"] + (a.carry if last else [])
    cmd = f"{recv} {d} {p}"
    if last:
        cmd += f" --install > $OUT/install.log 2>&1; rc=$?; tail -25 $OUT/install.log; [ $rc = 0 ] && {env}"
        if a.run:
            cmd += f" && {a.run}"
    sizes = sum(os.path.getsize(c) for c in carry if os.path.isfile(c))
    print(json.dumps({"call": k, "carry": carry, "carry_bytes": sizes, "command": cmd}))
