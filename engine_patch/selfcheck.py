"""Start-up self-check of the LoRA kernels on the real device, before the engine is built.

API (for the engine host; `python -m engine_patch.selfcheck` runs the kernel check and
prints a JSON report):

- `check_kernels(device=None, *, mitigate=True) -> KernelReport`
  Runs vLLM's punica shrink/expand ops for this platform (Triton `lora_shrink` /
  `lora_expand` on CUDA, looked up in `punica_gpu` so engine_patch's wrappers are what
  is tested; the torch `sgmv_*`/`bgmv_*` ops of `punica_cpu` on CPU) against an fp32
  torch reference at 1, 127, 128, 129, 512 and 2048 tokens, with several adapter slots
  and no-adapter (-1) tokens. A case passes when the output is finite, within
  `rtol * max|ref|` of the reference, and every no-adapter row is left bit-exact.
  On failure (and `mitigate`) it turns on the kernel mitigations engine_patch has
  (`lora_index_mask`; `hopper_expand` with VIDLORA_HOPPER_EXPAND=force, which the
  engine-core child inherits through the environment) and checks again; still failing
  raises `SelfCheckError`. Call it before building the engine: the mitigations patch
  module globals in this process.

The greedy probes through a built engine (adapter effect, canary) are `engine_patch.probes`.
"""
from __future__ import annotations

import importlib
import json
import logging
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

log = logging.getLogger("engine_patch.selfcheck")

TOKEN_COUNTS = (1, 127, 128, 129, 512, 2048)
# bf16 output rounding is 2^-8 relative; the LoRA delta adds a few more roundings.
RTOL = 2e-2


class SelfCheckError(RuntimeError):
    """A self-check failed and no mitigation helped; the message says which and how."""


@dataclass
class KernelCase:
    tokens: int
    ok: bool
    max_err: float
    bound: float
    finite: bool
    no_lora_rows_exact: bool
    error: str | None = None


@dataclass
class KernelReport:
    ok: bool
    device: str
    ops: str                      # "triton" | "torch" | "unsupported"
    dtype: str
    cases: list[KernelCase] = field(default_factory=list)
    mitigations: list[str] = field(default_factory=list)   # applied by this check
    first_attempt_ok: bool | None = None
    detail: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


# -- kernels --------------------------------------------------------------------------------
def _segments(idx: list[int]) -> list[tuple[int, int, int]]:
    """(start, length, lora index) of each run of equal indices: the requests of a batch."""
    segs: list[tuple[int, int, int]] = []
    for t, s in enumerate(idx):
        if segs and segs[-1][2] == s:
            segs[-1] = (segs[-1][0], segs[-1][1] + 1, s)
        else:
            segs.append((t, 1, s))
    return segs


def _mapping(tokens: int, max_loras: int) -> list[int]:
    # Contiguous requests: slot 0, 1, ..., max_loras-1, then no adapter (-1); 1 token -> slot 0.
    return [((t * (max_loras + 1)) // tokens + 1) % (max_loras + 1) - 1 for t in range(tokens)][::-1] \
        if tokens > 1 else [0]


def _make_case(tokens: int, device: str, dtype, *, hidden: int, slices: tuple[int, ...], rank: int,
               max_loras: int, seed: int):
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed + tokens)
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    a = [(torch.randn(max_loras, 1, rank, hidden, generator=g) / math.sqrt(hidden)).to(dtype) for _ in slices]
    b = [(torch.randn(max_loras, 1, n, rank, generator=g) / math.sqrt(rank)).to(dtype) for n in slices]
    y0 = torch.randn(tokens, sum(slices), generator=g).to(dtype)
    idx = _mapping(tokens, max_loras)
    scale = 0.5
    # fp32 reference on the bf16-rounded inputs: only the op's own arithmetic is judged.
    ref = y0.float().clone()
    off = 0
    it = torch.tensor(idx)
    for ai, bi, n in zip(a, b, slices):
        sel = it.clamp(min=0)
        h = torch.einsum("ti,tri->tr", x.float(), ai.float()[sel, 0]) * scale
        d = torch.einsum("tr,tor->to", h, bi.float()[sel, 0])
        ref[:, off:off + n] += torch.where((it >= 0)[:, None], d, torch.zeros(()))
        off += n
    mv = lambda t: t.to(device)  # noqa: E731
    return mv(x), [mv(t) for t in a], [mv(t) for t in b], mv(y0), idx, scale, ref


def _run_torch_ops(x, a, b, y, idx, scale, rank, slices):
    """vLLM's CPU path: punica_cpu's sgmv_* (prefill) / bgmv_* (decode), as PunicaWrapperCPU calls them."""
    import torch

    pc = importlib.import_module("vllm.lora.punica_wrapper.punica_cpu")
    tokens = x.shape[0]
    off = 0
    segs = _segments(idx)
    starts = torch.tensor([s for s, _, _ in segs], device=x.device)
    lens = torch.tensor([n for _, n, _ in segs], device=x.device)
    seg_idx = torch.tensor([i for _, _, i in segs], device=x.device)
    tok_idx = torch.tensor(idx, device=x.device)
    for ai, bi, n in zip(a, b, slices):
        buf = torch.zeros(tokens, rank, dtype=torch.float32, device=x.device)
        if tokens == 1:
            pc.bgmv_shrink(x, ai, buf, tok_idx, scale)
            pc.bgmv_expand_slice(buf, bi, y, tok_idx, off, n, True)
        else:
            meta = (starts, lens, seg_idx, len(segs), int(lens.max()), tokens)
            pc.sgmv_shrink(x, ai, buf, *meta, scale)
            pc.sgmv_expand_slice(buf, bi, y, *meta, off, n, True)
        off += n


def _run_triton_ops(x, a, b, y, idx, scale, rank, slices, max_loras):
    """vLLM's CUDA path: PunicaWrapperGPU.add_shrink / add_expand, through punica_gpu's globals."""
    import inspect

    import torch

    pg = importlib.import_module("vllm.lora.punica_wrapper.punica_gpu")
    from vllm.lora.ops.triton_ops import LoRAKernelMeta

    tokens = x.shape[0]
    meta = LoRAKernelMeta.make(max_loras, tokens, device=x.device)
    meta.prepare_tensors(torch.tensor(idx, dtype=torch.int32, device=x.device))
    margs = inspect.signature(meta.meta_args).parameters
    args = meta.meta_args(tokens, False) if len(margs) >= 2 else meta.meta_args(tokens)
    buf = torch.zeros(len(slices), tokens, rank, dtype=torch.float32, device=x.device)
    pg.lora_shrink(x, list(ai for ai in a), buf, *args, scale)
    pg.lora_expand(buf, list(bi for bi in b), y, *args, offset_start=0, add_inputs=True)


def _platform(device: str | None) -> tuple[str, str]:
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda"):
        return device, "triton"
    if str(device) == "cpu":
        return device, "torch"
    return device, "unsupported"


def run_kernel_cases(device: str | None = None, *, dtype: str = "bfloat16", token_counts: Sequence[int] = TOKEN_COUNTS,
                     hidden: int = 512, slices: tuple[int, ...] = (512, 256), rank: int = 16, max_loras: int = 3,
                     rtol: float = RTOL, seed: int = 0) -> tuple[str, str, list[KernelCase]]:
    import torch

    device, ops = _platform(device)
    cases: list[KernelCase] = []
    if ops == "unsupported":
        return device, ops, cases
    tdt = getattr(torch, dtype)
    for n in token_counts:
        x, a, b, y, idx, scale, ref = _make_case(n, device, tdt, hidden=hidden, slices=slices, rank=rank,
                                                 max_loras=max_loras, seed=seed)
        y0 = y.clone()
        try:
            if ops == "triton":
                _run_triton_ops(x, a, b, y, idx, scale, rank, slices, max_loras)
                torch.cuda.synchronize()
            else:
                _run_torch_ops(x, a, b, y, idx, scale, rank, slices)
        except Exception as exc:  # noqa: BLE001 - a crashing kernel is a failed check
            cases.append(KernelCase(n, False, float("inf"), 0.0, False, False, f"{type(exc).__name__}: {exc}"[:300]))
            continue
        yf = y.float().cpu()
        finite = bool(torch.isfinite(yf).all())
        err = float((yf - ref).abs().max()) if finite else float("inf")
        bound = rtol * float(ref.abs().max())
        none_rows = torch.tensor(idx) < 0
        exact = bool(torch.equal(y.cpu()[none_rows], y0.cpu()[none_rows])) if none_rows.any() else True
        cases.append(KernelCase(n, finite and err <= bound and exact, err, bound, finite, exact))
    return device, ops, cases


def _mitigate() -> list[str]:
    """Turn on engine_patch's kernel mitigations that are not on yet; return their names."""
    os.environ["VIDLORA_HOPPER_EXPAND"] = "force"  # inherited by the engine core vLLM spawns
    done = []
    for name in ("lora_index_mask", "hopper_expand"):
        patch = importlib.import_module(f"engine_patch.patches.{name}").PATCH
        try:
            why_not = patch.probe()
        except Exception as exc:  # noqa: BLE001
            why_not = f"probe failed: {exc!r}"
        if why_not is None:
            patch.apply()
            done.append(name)
        else:
            log.info("selfcheck: mitigation %s not applied: %s", name, why_not)
    return done


def _describe(cases: list[KernelCase]) -> str:
    bad = [c for c in cases if not c.ok]
    return "; ".join(
        f"{c.tokens} tok: " + (c.error or ("non-finite" if not c.finite else
                                          f"err {c.max_err:.3g} > {c.bound:.3g}" if c.max_err > c.bound else "")
                               + ("" if c.no_lora_rows_exact else " no-adapter rows changed"))
        for c in bad)


def check_kernels(device: str | None = None, *, mitigate: bool = True, dtype: str = "bfloat16",
                  token_counts: Sequence[int] = TOKEN_COUNTS, **shape: Any) -> KernelReport:
    """LoRA shrink/expand vs fp32 torch; mitigations and a re-check on failure (see module doc)."""
    dev, ops, cases = run_kernel_cases(device, dtype=dtype, token_counts=token_counts, **shape)
    rep = KernelReport(ok=bool(cases) and all(c.ok for c in cases), device=dev, ops=ops, dtype=dtype, cases=cases)
    rep.first_attempt_ok = rep.ok
    if ops == "unsupported":
        rep.ok, rep.detail = True, f"no LoRA kernel check for device {dev}"
        return rep
    if rep.ok:
        rep.detail = f"{ops} LoRA ops match fp32 at {list(token_counts)} tokens"
        return rep
    first = _describe(cases)
    log.warning("selfcheck: LoRA kernels wrong on %s: %s", dev, first)
    if not mitigate:
        rep.detail = first
        return rep
    rep.mitigations = _mitigate()
    _, _, cases = run_kernel_cases(device, dtype=dtype, token_counts=token_counts, **shape)
    rep.cases, rep.ok = cases, all(c.ok for c in cases)
    if not rep.ok:
        from .env import versions

        raise SelfCheckError(
            f"LoRA {ops} kernels on {dev} disagree with the fp32 reference: {_describe(cases)} "
            f"(before mitigations: {first}); mitigations applied: {rep.mitigations or 'none available'}; "
            f"versions {versions()}. Do not serve LoRA on this engine: upgrade Triton/ptxas (>= 13.3 on sm_90) "
            f"or vLLM, or serve merged weights.")
    rep.detail = f"fixed by {rep.mitigations} (was: {first})"
    log.warning("selfcheck: %s", rep.detail)
    return rep


def main(argv: list[str] | None = None) -> int:
    import argparse

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    ap = argparse.ArgumentParser(prog="python -m engine_patch.selfcheck", description="LoRA kernel self-check")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--no-mitigate", action="store_true")
    a = ap.parse_args(argv)
    try:
        rep = check_kernels(a.device, mitigate=not a.no_mitigate, dtype=a.dtype)
    except SelfCheckError as exc:
        print(json.dumps({"ok": False, "error": str(exc)}))
        return 2
    from .env import versions

    print(json.dumps({**rep.to_dict(), "versions": versions()}, indent=1, default=str))
    return 0 if rep.ok else 1


if __name__ == "__main__":
    sys.exit(main())
