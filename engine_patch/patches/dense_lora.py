"""Dense LoRA for engine steps whose tokens sit in a few adapter runs (issue 14).

vidlora's dispatcher groups analyses by adapter and the engine host submits each batch sorted
by adapter, so most engine steps carry one adapter, or a few in contiguous runs. vLLM still
applies every LoRA module through its Punica ops, built for any token-to-adapter mix: on the
CPU they copy each token's adapter weights before a mat-vec per token (`weights[indices]` in
`lora/ops/torch_ops`), on the GPU the Triton kernels cost several times their memory floor.
Here a step whose tokens form at most `max_segments` adapter runs applies each run with plain
GEMMs on that adapter's slot: one shrink per slice, one expand per slice added into the output.
Every other step, and every CUDA-graph capture, stays on Punica.

How the path is chosen, per step and for free:
- `update_metadata` (when vLLM's adapter mapping changes) turns `mapping.index_mapping`, the
  host tuple of one LoRA id per scheduled token, into a `Plan`: the runs `(start, end, slot)`
  and the token count. No device sync.
- `add_shrink` / `add_expand` (every LoRA linear: column-parallel and packed layers through
  `add_lora_linear`, row-parallel `o_proj` / `down_proj` / GDN `out_proj` directly) call one
  custom op each, `vidlora::lora_shrink` / `vidlora::lora_expand`. The choice happens inside the
  op because on the GPU the wrapper's Python is traced once by torch.compile (a Python `if`
  there is frozen) and CUDA-graph replays run no Python at all. The op goes dense when the
  plan allows it, covers exactly this call's rows and no graph is being captured; otherwise it
  runs the stock wrapper method. Captured sizes (decode steps, up to 2 x max_num_seqs tokens)
  therefore replay Punica, reading the device metadata Punica keeps current.
- Tested on single-rank engines only (vidlora runs one engine per GPU). Under tensor
  parallelism the row-parallel layer all-reduces the buffer between the two ops and passes its
  shard's `offset_start`, both of which the dense ops honour, but no such run has been made.

Numerics mirror the stock op of each platform: on the CPU the shrink runs in fp32 (as the
torch ops do), on the GPU in the weights' dtype with fp32 accumulation, rounded once, which
is where Punica's expand rounds its fp32 buffer too. Rows outside every run get an exact zero
shrink and no expand, as index -1 does under `lora_index_mask`.

Switch: `VIDLORA_DENSE_LORA=off` keeps stock Punica (the benchmark's comparison side);
`VIDLORA_DENSE_LORA_MAX_SEGMENTS` (default 4) bounds the runs a dense step may have.
`counts()` says how many module applications ran each way in this process (dense, punica, or
base: a step without adapter tokens); the engine host reports it per batch.
"""
from __future__ import annotations

import itertools
import logging
import os
import threading
import weakref
from dataclasses import dataclass

import torch

from .base import Patch, is_marked, wraps_marked

log = logging.getLogger("engine_patch.dense_lora")

_WRAPPER_MODULES = {
    "PunicaWrapperCPU": "vllm.lora.punica_wrapper.punica_cpu",
    "PunicaWrapperGPU": "vllm.lora.punica_wrapper.punica_gpu",
}
DEFAULT_MAX_SEGMENTS = 4


@dataclass(frozen=True, slots=True)
class Plan:
    """One step's tokens as adapter runs: ``segments`` of ``(start, end, slot)``, base runs left out."""
    n_tokens: int
    segments: tuple[tuple[int, int, int], ...]
    runs: int  # adapter runs, base runs included: what max_segments bounds


def plan_for(index_mapping, lora_index_to_id, max_segments: int) -> Plan | None:
    """The dense plan of one step, or None when it has more than ``max_segments`` runs.

    ``index_mapping``: one LoRA id per token (0: no adapter); ``lora_index_to_id``: slot -> id,
    the same lookup vLLM's ``convert_mapping`` uses to give Punica each token's slot.
    """
    slot_of = {lid: slot for slot, lid in enumerate(lora_index_to_id) if lid is not None}
    segments, start, runs = [], 0, 0
    for lid, group in itertools.groupby(index_mapping):
        n = sum(1 for _ in group)
        runs += 1
        if runs > max_segments:
            return None
        if lid > 0:
            slot = slot_of.get(lid)
            if slot is None:  # an id without a slot: Punica decides what that means
                return None
            segments.append((start, start + n, slot))
        start += n
    return Plan(n_tokens=start, segments=tuple(segments), runs=runs)


# -- the dense kernels (shared by both platforms) ------------------------------------------------

def dense_shrink(y, x: torch.Tensor, lora_a_stacked, scale: float, segments, compute_dtype) -> None:
    """``y[i][rows] = scale * x[rows] @ A_i[slot]^T`` per run; every other row of ``y[i]`` = 0.

    ``y``: a tuple of ``[tokens, rank]`` buffers or one ``[slices, tokens, rank]`` tensor (fp32).
    """
    xc = x if x.dtype == compute_dtype else x.to(compute_dtype)
    for i, a in enumerate(lora_a_stacked):
        out = y[i]
        rank = a.shape[-2]
        covered = 0
        for start, end, slot in segments:
            w = a[slot, 0]
            if w.dtype != compute_dtype:
                w = w.to(compute_dtype)
            prod = torch.mm(xc[start:end], w.t())
            if scale != 1.0:
                prod = prod * scale
            out[start:end, :rank].copy_(prod)
            covered += end - start
        if covered != out.shape[0]:
            _zero_outside(out, segments)


def dense_expand(y: torch.Tensor, x, lora_b_stacked, output_slices, offset_start: int,
                 add_inputs: bool, segments) -> None:
    """``y[rows, slice_i] += x[i][rows] @ B_i[slot]^T`` per run (``=`` when not ``add_inputs``,
    and then 0 outside the runs, as the stock op writes).

    Rounding follows the stock op of the platform, so that a request gets the same numbers on
    either path (a one-adapter batch runs dense, a many-adapter batch Punica): the GPU kernel
    adds its fp32 accumulator to the output and rounds once (``addmm_``); the CPU op rounds the
    product to the output dtype and then the sum (``mm``, then ``+=``)."""
    round_twice = not y.is_cuda
    offset = offset_start
    for i, b in enumerate(lora_b_stacked):
        width = output_slices[i]
        cols = y[:, offset:offset + width]
        xi = x[i]
        if not add_inputs:
            cols.zero_()
        for start, end, slot in segments:
            w = b[slot, 0][:width]
            xs = xi[start:end, : w.shape[-1]]
            if xs.dtype != y.dtype:
                xs = xs.to(y.dtype)
            if w.dtype != y.dtype:
                w = w.to(y.dtype)
            if round_twice:
                cols[start:end] += torch.mm(xs, w.t())
            else:
                cols[start:end].addmm_(xs, w.t())
        offset += width


def _zero_outside(out: torch.Tensor, segments) -> None:
    prev = 0
    for start, end, _ in segments:
        if start > prev:
            out[prev:start].zero_()
        prev = end
    if prev < out.shape[0]:
        out[prev:].zero_()


# -- which path: the plan, the counters, the ops --------------------------------------------------

# "base": a step with no adapter tokens (the shrink writes zeros, nothing is added).
_counts = {"dense": 0, "punica": 0, "base": 0}
_counts_lock = threading.Lock()
# key -> Punica wrapper, so the ops take a plain int; weak, so a closed engine's wrapper goes.
_wrappers: weakref.WeakValueDictionary[int, object] = weakref.WeakValueDictionary()
_next_key = itertools.count(1)


def counts() -> dict[str, int]:
    """LoRA module applications in this process by path (ops that ran Python: graph replays
    are not seen)."""
    with _counts_lock:
        return dict(_counts)


def _count(path: str) -> None:
    with _counts_lock:
        _counts[path] += 1


_enabled = True


def set_enabled(on: bool) -> None:
    """Turn the dense path off (and on again) in a running process, so a benchmark measures
    Punica and dense side by side on one engine. Production uses VIDLORA_DENSE_LORA."""
    global _enabled
    _enabled = bool(on)


def max_segments() -> int:
    return max(1, int(os.environ.get("VIDLORA_DENSE_LORA_MAX_SEGMENTS", DEFAULT_MAX_SEGMENTS)))


def _capturing(x: torch.Tensor) -> bool:
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


def _dense_segments(wrapper, x: torch.Tensor):
    """The runs to apply densely for this call, or None for Punica."""
    plan = getattr(wrapper, "_vidlora_plan", None)
    if plan is None or not _enabled or plan.n_tokens != x.shape[0] or _capturing(x):
        return None
    return plan.segments


def _shrink(wrapper, y, x: torch.Tensor, lora_a, scale: float) -> None:
    x2 = x.view(-1, x.shape[-1])
    segments = _dense_segments(wrapper, x2)
    if segments is None:
        _count("punica")
        type(wrapper).add_shrink.__vidlora_orig__(wrapper, y, x, tuple(lora_a), scale)
        return
    _count("dense" if segments else "base")
    # The CPU's stock op computes the shrink in fp32; the GPU's accumulates in fp32 and its
    # expand rounds the result to the weights' dtype, which one bf16 GEMM does too.
    compute = torch.float32 if x2.device.type == "cpu" else x2.dtype
    dense_shrink(y, x2, lora_a, scale, segments, compute)


def _expand(wrapper, y: torch.Tensor, x, lora_b, output_slices, offset_start: int, add_inputs: bool) -> None:
    y2 = y.view(-1, y.shape[-1])
    segments = _dense_segments(wrapper, y2)
    if segments is None:  # counted once per module application, at its shrink
        type(wrapper).add_expand.__vidlora_orig__(wrapper, y, x, tuple(lora_b), tuple(output_slices),
                                                  offset_start=offset_start, add_inputs=add_inputs)
        return
    # The GPU's stock expand always adds (it ignores add_inputs); the CPU's honours it.
    dense_expand(y2, x, lora_b, output_slices, offset_start, add_inputs or y.is_cuda, segments)


def _shrink_op(y: torch.Tensor, x: torch.Tensor, lora_a: list[torch.Tensor], scale: float,
               wrapper_key: int) -> None:
    _shrink(_wrappers[wrapper_key], y, x, lora_a, scale)


def _expand_op(y: torch.Tensor, x: torch.Tensor, lora_b: list[torch.Tensor], output_slices: list[int],
               offset_start: int, add_inputs: bool, wrapper_key: int) -> None:
    _expand(_wrappers[wrapper_key], y, x, lora_b, output_slices, offset_start, add_inputs)


def _noop(*args, **kwargs) -> None:
    return None


_ops: dict[str, object] = {}


def _register_ops() -> None:
    """`vidlora::lora_shrink` / `vidlora::lora_expand`, opaque to torch.compile."""
    if _ops:
        return
    from torch.library import Library

    from vllm.utils.torch_utils import direct_register_custom_op

    lib = Library("vidlora", "FRAGMENT")
    _ops["lib"] = lib  # the ops live as long as the library object
    direct_register_custom_op("lora_shrink", _shrink_op, mutates_args=["y"], fake_impl=_noop, target_lib=lib)
    direct_register_custom_op("lora_expand", _expand_op, mutates_args=["y"], fake_impl=_noop, target_lib=lib)


def _wrap_update_metadata(orig):
    @wraps_marked(orig)
    def update_metadata(self, mapping, lora_index_to_id, *args, **kwargs):
        orig(self, mapping, lora_index_to_id, *args, **kwargs)
        try:
            self._vidlora_plan = plan_for(mapping.index_mapping, lora_index_to_id, max_segments())
        except Exception:  # noqa: BLE001 - an unexpected mapping shape keeps Punica
            log.exception("dense_lora: cannot plan this mapping; Punica runs it")
            self._vidlora_plan = None
    return update_metadata


def _wrap_init(orig):
    # The key is set here, outside any compiled region: torch.compile reads it as a constant.
    @wraps_marked(orig)
    def __init__(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        self._vidlora_key = next(_next_key)
        self._vidlora_plan = None
        _wrappers[self._vidlora_key] = self
    return __init__


# Buffers come as one stacked tensor (the GPU wrapper, row-parallel layers) or, from the CPU
# wrapper's add_lora_linear, as a tuple of per-slice tensors. A tuple is only ever seen on the
# CPU, where nothing is compiled, so it takes the Python path directly; a tensor goes through
# the op, whose body is where a compiled graph still runs Python.
def _wrap_add_shrink(orig):
    @wraps_marked(orig)
    def add_shrink(self, y, x, lora_a_stacked, scale, **kwargs):
        if isinstance(y, torch.Tensor):
            torch.ops.vidlora.lora_shrink(y, x, list(lora_a_stacked), float(scale), self._vidlora_key)
        else:
            _shrink(self, y, x, lora_a_stacked, scale)
    return add_shrink


def _wrap_add_expand(orig):
    @wraps_marked(orig)
    def add_expand(self, y, x, lora_b_stacked, output_slices, offset_start=0, add_inputs=True, **kwargs):
        if isinstance(x, torch.Tensor):
            torch.ops.vidlora.lora_expand(y, x, list(lora_b_stacked), [int(s) for s in output_slices],
                                          int(offset_start), bool(add_inputs), self._vidlora_key)
        else:
            _expand(self, y, x, lora_b_stacked, output_slices, offset_start, add_inputs)
    return add_expand


def _targets() -> list[type]:
    import importlib

    found = []
    for cls_name, mod_name in _WRAPPER_MODULES.items():
        try:
            mod = importlib.import_module(mod_name)
        except Exception:  # noqa: BLE001 - the GPU wrapper needs Triton
            continue
        cls = getattr(mod, cls_name, None)
        if cls is not None:
            found.append(cls)
    return found


def probe() -> str | None:
    if os.environ.get("VIDLORA_DENSE_LORA", "on") == "off":
        return "disabled by VIDLORA_DENSE_LORA=off"
    try:
        from vllm.utils.torch_utils import direct_register_custom_op  # noqa: F401
    except ImportError:
        return "vllm.utils.torch_utils.direct_register_custom_op not present"
    targets = _targets()
    if not targets:
        return "no Punica wrapper importable"
    for cls in targets:
        for name in ("__init__", "update_metadata", "add_shrink", "add_expand"):
            if not callable(getattr(cls, name, None)):
                return f"{cls.__name__}.{name} missing: layout differs from 0.26-0.33"
    if all(is_marked(cls.add_shrink) for cls in targets):
        return "already applied"
    return None


def apply() -> None:
    _register_ops()
    for cls in _targets():
        if is_marked(cls.add_shrink):
            continue
        # Set on each class (update_metadata is inherited from PunicaWrapperBase on the CPU).
        cls.__init__ = _wrap_init(cls.__init__)
        cls.update_metadata = _wrap_update_metadata(cls.update_metadata)
        cls.add_shrink = _wrap_add_shrink(cls.add_shrink)
        cls.add_expand = _wrap_add_expand(cls.add_expand)


PATCH = Patch(
    name="dense_lora",
    covers="issue 14: one-adapter (or few-run) steps apply LoRA with dense GEMMs instead of Punica",
    probe=probe,
    apply=apply,
)
