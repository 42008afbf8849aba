"""Slim the v27+ wheel set for an H200 (sm_90) running a dense bf16 model, re-store every wheel
uncompressed (so xz can squeeze it), and rewrite RECORD for every file changed.

Same idea as shared/gpu/slim_payload.py (which does this for vLLM 0.26), plus:
  * the 0.26 drop list carried over to vLLM >= 0.27 (FA2, vllm-rs, MoE ops, DeepGEMM JIT headers,
    Blackwell fmha), and in torch/triton what a Hopper engine never loads (static libs, the
    Blackwell ptxas, test/instrumentation libs, torch's protoc);
  * optional fatbin pruning (--prune-sm 90): in every ELF .so's .nv_fatbin section, each fatbin
    that holds an sm_90 cubin keeps only its sm_90 entries (moved to the fatbin's front, its
    fatSize shrunk, the freed tail zeroed, so xz makes nothing of it). A fatbin without an sm_90
    entry is left as it was. Host code and the registration wrappers are untouched: what the
    CUDA runtime sees is what an arch-list-9.0 build would have given. NOT YET SEEN ON THE DEVICE
    (plan.md: the first call checks it); without --prune-sm nothing inside an .so is changed.

usage: slim.py STAGEDIR WHEEL.whl... [--prune-sm 90] [--report report.tsv]
(a wheel whose staged copy already exists in STAGEDIR is skipped; delete it to redo)
"""
import argparse, base64, csv, hashlib, io, os, re, struct, subprocess, sys, tempfile, zipfile

# --- files never loaded by a dense bf16 model on Hopper (prefix match unless noted) -------------
VLLM_DROP = (
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",   # FA2; Hopper runs FA3 (as for 0.26)
    "vllm/vllm-rs",                               # Rust front end of `vllm serve`
    "vllm/_moe_C_stable_libtorch.abi3.so",        # MoE ops; optional import (platforms/cuda.py)
    "vllm/third_party/deep_gemm/include/",        # FP8 DeepGEMM JIT headers
    "vllm/_flashkda_C.abi3.so",                   # Kimi/GLM KDA kernels; imported by those models only
    "vllm/_deepselect_C.abi3.so",                 # DeepSeek sparse-attention top-k; find_spec-guarded
)
# A MoE base (Qwen3.6-35B-A3B, `stages.sh moe`) needs the MoE ops: KEEP_MOE=1 keeps them
# (without them its first request fails: "_moe_C has no attribute topk_softmax", seen with 0.33).
if os.environ.get("KEEP_MOE") == "1":
    VLLM_DROP = tuple(p for p in VLLM_DROP if "_moe_C" not in p)
VLLM_DROP_RE = (re.compile(r"^vllm/third_party/fmha_sm100/.*(?<!\.py)$"),        # Blackwell fmha
                re.compile(r"^vllm/third_party/deep_gemm/_C\.cpython-(?!312)"))  # 0.26 layout
TORCH_DROP = (
    "torch/bin/protoc",                           # protoc + protoc-3.13.0.0 (build tool)
    "torch/lib/libshm_windows/",
)
TRITON_DROP = (
    "triton/backends/nvidia/bin/ptxas-blackwell", # used only for arch >= 100 (compiler.get_ptxas)
    "triton/backends/nvidia/lib/cupti/libcupti_static.a",
    "triton/backends/nvidia/lib/cupti/libnvperf_host_static.a",
    "triton/instrumentation/libGPUInstrumentationTestLib.so",
    "triton/plugins/libTritonPluginsTestLib.so",
    "triton/FileCheck",                           # LLVM test tool
)


def dropped(wheel, name):
    if wheel.startswith("vllm-"):
        return name.startswith(VLLM_DROP) or any(r.match(name) for r in VLLM_DROP_RE)
    if wheel.startswith("torch-"):
        return name.startswith(TORCH_DROP)
    if wheel.startswith("triton-"):
        return name.startswith(TRITON_DROP)
    return False


# --- fatbin pruning -------------------------------------------------------------------------
FATBIN_MAGIC = 0xBA55ED50


def nv_fatbin_section(path):
    out = subprocess.run(["readelf", "-S", "-W", path], capture_output=True, text=True).stdout
    for line in out.splitlines():
        m = re.search(r"\]\s+(\S+)\s+\S+\s+[0-9a-f]+\s+([0-9a-f]+)\s+([0-9a-f]+)", line)
        if m and m.group(1) == ".nv_fatbin":
            return int(m.group(2), 16), int(m.group(3), 16)
    return None


def prune_fatbins(data: bytearray, off: int, size: int, keep_sm: int):
    """In place. Returns (bytes of entries dropped, fatbins changed, fatbins kept whole)."""
    pos, end = off, off + size
    freed = changed = whole = 0
    while pos + 16 <= end:
        magic, _ver, hsz, fsz = struct.unpack_from("<IHHQ", data, pos)
        if magic != FATBIN_MAGIC:
            pos += 8
            continue
        body, body_end = pos + hsz, pos + hsz + fsz
        ents, e = [], body
        while e < body_end:
            kind, _v, ehsz, psize = struct.unpack_from("<HHIQ", data, e)
            arch = struct.unpack_from("<I", data, e + 28)[0]
            ents.append((kind, arch, e, ehsz + psize))
            e += ehsz + psize
        if e != body_end:
            raise ValueError(f"fatbin at {pos:#x}: entries overrun ({e:#x} != {body_end:#x})")
        keep = [x for x in ents if x[1] == keep_sm]
        if not keep or len(keep) == len(ents):
            whole += 1
        else:
            blob = b"".join(bytes(data[x[2]:x[2] + x[3]]) for x in keep)
            data[body:body + len(blob)] = blob
            data[body + len(blob):body_end] = bytes(body_end - body - len(blob))
            struct.pack_into("<Q", data, pos + 8, len(blob))
            freed += fsz - len(blob)
            changed += 1
        pos = body_end
    return freed, changed, whole


def maybe_prune(name, raw, keep_sm, report):
    if keep_sm is None or not (name.endswith(".so") or ".so." in os.path.basename(name)):
        return raw
    if raw[:4] != b"\x7fELF":
        return raw
    with tempfile.NamedTemporaryFile(suffix=".so") as t:
        t.write(raw)
        t.flush()
        sec = nv_fatbin_section(t.name)
    if not sec:
        return raw
    data = bytearray(raw)
    freed, changed, whole = prune_fatbins(data, sec[0], sec[1], keep_sm)
    report.append((name, len(raw), sec[1], freed, changed, whole))
    return bytes(data) if changed else raw


def record_hash(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("stage")
    ap.add_argument("wheel", nargs="+")
    ap.add_argument("--prune-sm", type=int, default=None)
    ap.add_argument("--report", default=None)
    a = ap.parse_args()
    os.makedirs(a.stage, exist_ok=True)
    report = []
    for w in a.wheel:
        wn = os.path.basename(w)
        dst = os.path.join(a.stage, wn)
        if os.path.exists(dst):
            print(f"{wn}: staged already", flush=True)
            continue
        new_hash = {}
        with zipfile.ZipFile(w) as zin, zipfile.ZipFile(dst + ".tmp", "w", zipfile.ZIP_STORED) as zout:
            infos = zin.infolist()
            rec_info = None
            for info in infos:
                if dropped(wn, info.filename):
                    new_hash[info.filename] = None
                    continue
                if info.filename.endswith(".dist-info/RECORD"):
                    rec_info = info
                    continue
                data = zin.read(info)
                pruned = maybe_prune(info.filename, data, a.prune_sm, report)
                if pruned is not data:
                    new_hash[info.filename] = (record_hash(pruned), str(len(pruned)))
                zi = zipfile.ZipInfo(info.filename, info.date_time)
                zi.external_attr = info.external_attr
                zout.writestr(zi, pruned, zipfile.ZIP_STORED)
            rows = []
            for r in csv.reader(io.StringIO(zin.read(rec_info).decode())):
                if not r:
                    continue
                if r[0] in new_hash:
                    if new_hash[r[0]] is None:
                        continue
                    r = [r[0], *new_hash[r[0]]]
                rows.append(r)
            buf = io.StringIO()
            csv.writer(buf, lineterminator="\n").writerows(rows)
            zi = zipfile.ZipInfo(rec_info.filename, rec_info.date_time)
            zi.external_attr = rec_info.external_attr
            zout.writestr(zi, buf.getvalue().encode(), zipfile.ZIP_STORED)
        os.replace(dst + ".tmp", dst)
        nd = sum(1 for v in new_hash.values() if v is None)
        print(f"{wn}: dropped {nd} files, pruned {sum(1 for v in new_hash.values() if v)}", flush=True)
    if report:
        new = not (a.report and os.path.exists(a.report))
        lines = ["file\tsize\tnv_fatbin\tfreed\tfatbins_pruned\tfatbins_whole"] if new else []
        lines += ["\t".join(map(str, r)) for r in report]
        if a.report:
            with open(a.report, "a") as f:
                f.write("\n".join(lines) + "\n")
        for r in report:
            if r[3]:
                print(f"  pruned {r[0]}: .nv_fatbin {r[2]/1e6:.1f} MB, freed {r[3]/1e6:.1f} MB "
                      f"({r[4]} fatbins pruned, {r[5]} kept whole)")

if __name__ == "__main__":
    main()
