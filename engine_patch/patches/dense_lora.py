"""Dense LoRA for engine steps whose tokens sit in a few adapter runs (issue 14).

vidlora's dispatcher groups analyses by adapter and the engine host submits each batch sorted
by adapter, so most engine steps carry one adapter, or a few in contiguous runs. vLLM still
applies every LoRA module through its Punica ops, built for any token-to-adapter mix: on the
CPU they copy each token's adapter weights before a mat-vec per token (`weights[indices]` in
`lora/ops/torch_ops`), on the GPU the Triton kernels cost several times their memory floor.
Here a step whose tokens form at most `max_segments` adapter runs applies each run with plain
GEMMs on that adapter's slot: one shrink per slice, one expand per slice added into the output.
Every other eager step stays on Punica.

CUDA graphs (issue 35): a captured graph replays the kernels of its capture, whatever the next
step's adapters are, so the runs cannot be planned there, and captured steps replay Punica. On
the H200 a decode-only step with one adapter costs 1.51x the same step without LoRA
(`bench/results/streaming_h200.md`). `VIDLORA_DENSE_LORA_GRAPHS=on` makes the ops record the
*all-slots* form while a graph is captured: per slice, one GEMM of the tokens against every
slot's A at once (``[tokens, max_loras x rank]``), a mask keeping each token's own slot's
columns (one-hot rows in persistent buffers the wrapper rewrites from vLLM's
``_token_lora_indices`` at every mapping, before any replay), and one GEMM against every slot's
B side by side. Another slot's columns add exact zeros, so the result is the per-slot product:
on the H200 its replays under three other mappings matched fp32 exactly as closely as Punica's,
and `engine_patch.verify` with CUDA graphs passed with it. It is not the default because it is
slower than Punica at decode sizes: (base + LoRA) / base over a 27B layer's linears, 1.58x ->
2.34x at 16 tokens, 1.95x -> 2.11x at 256, faster only at 512 (1.87x -> 1.69x)
(`bench/results/lora_graphs_h200.md`): four cuBLAS kernels per slice, the shrink a skinny GEMM
with little parallelism, lose to Punica's two Triton kernels.

How the path is chosen, per step and for free:
- `update_metadata` (when vLLM's adapter mapping changes) turns `mapping.index_mapping`, the
  host tuple of one LoRA id per scheduled token, into a `Plan`: the runs `(start, end, slot)`
  and the token count. No device sync.
- `add_lora_linear` (column-parallel and packed layers) calls `vidlora::lora_linear`, which
  takes the all-slots form or runs the stock method; `add_shrink` / `add_expand` (reached from
  there, and directly from row-parallel `o_proj` / `down_proj` / GDN `out_proj`) call
  `vidlora::lora_shrink` / `vidlora::lora_expand`. The choice happens inside the
  op because on the GPU the wrapper's Python is traced once by torch.compile (a Python `if`
  there is frozen) and CUDA-graph replays run no Python at all. While a graph is captured
  (decode steps and small mixed steps, up to the largest capture size) the ops record Punica
  (or the all-slots form, when switched on); otherwise they go dense when the plan allows it
  and covers exactly this call's rows, and run the stock wrapper method (Punica) when not.
- Tested on single-rank engines only (vidlora runs one engine per GPU). Under tensor
  parallelism the row-parallel layer all-reduces the buffer between the two ops and passes its
  shard's `offset_start`, both of which the dense ops honour, but no such run has been made.

Numerics mirror the stock op of each platform: on the CPU the shrink runs in fp32 (as the
torch ops do), on the GPU in the weights' dtype with fp32 accumulation, rounded once, which
is where Punica's expand rounds its fp32 buffer too. Rows outside every run get an exact zero
shrink and no expand, as index -1 does under `lora_index_mask`.

Switch: `VIDLORA_DENSE_LORA=off` keeps stock Punica (the benchmark's comparison side);
`VIDLORA_DENSE_LORA_MAX_SEGMENTS` (default 4) bounds the runs a dense step may have;
`VIDLORA_DENSE_LORA_GRAPHS` chooses what a CUDA graph captures: `off` (default) Punica, `on`
the all-slots form, `always` the all-slots form on every step, eager ones too (how the CPU
proves its numbers through a real engine, where nothing is captured).
`counts()` says how many module applications ran each way in this process (dense, all_slots,
punica, or base: a step without adapter tokens; a graph's are counted once, at its capture); the
engine host reports it per batch.
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


def all_slots_linear(y: torch.Tensor, x: torch.Tensor, lora_a_stacked, lora_b_stacked, scale: float,
                     output_slices, add_inputs: bool, pick: torch.Tensor) -> None:
    """``y[t, slice_i] += scale * x[t] @ A_i[s]^T @ B_i[s]^T`` with ``s`` token t's slot, for every
    token at once (nothing where ``pick[t]`` is a row of 0).

    ``pick``: ``[tokens, slots]`` one-hot in the shrink's compute dtype. Graph-safe: no host
    sync and no shape that depends on the mapping, so a CUDA graph captured with it is right for
    whatever mapping ``pick`` holds at replay. Per slice four kernels: the shrink against every
    slot (``A`` viewed ``[slots x rank, hidden]``), the mask, ``B``'s slots side by side, the
    expand. Rounds as the per-run dense path: the shrink once in its compute dtype, the expand as
    `dense_expand`."""
    tokens = x.shape[0]
    compute = pick.dtype
    xc = x if x.dtype == compute else x.to(compute)
    if scale != 1.0:
        pick = pick * scale
    offset = 0
    for a, b, width in zip(lora_a_stacked, lora_b_stacked, output_slices):
        masked = _masked_shrink(xc, a, pick)
        if masked.dtype != y.dtype:
            masked = masked.to(y.dtype)
        _spread_expand(y[:, offset:offset + width], masked, b, width, add_inputs)
        offset += width


def all_slots_shrink(y, x: torch.Tensor, lora_a_stacked, scale: float, pick: torch.Tensor) -> None:
    """``y[i][t] = scale * x[t] @ A_i[slot(t)]^T`` for every token, 0 where ``pick[t]`` is 0:
    the row-parallel layers' shrink (their buffer may be all-reduced before the expand).
    ``pick`` in the shrink's compute dtype; graph-safe as `all_slots_linear`."""
    tokens = x.shape[0]
    xc = x if x.dtype == pick.dtype else x.to(pick.dtype)
    if scale != 1.0:
        pick = pick * scale
    for i, a in enumerate(lora_a_stacked):
        slots, _, rank, _ = a.shape
        # Another slot's columns are exact zeros, so the sum over slots is the token's own.
        y[i][:, :rank].copy_(_masked_shrink(xc, a, pick).view(tokens, slots, rank).sum(1))


def all_slots_expand(y: torch.Tensor, x, lora_b_stacked, output_slices, offset_start: int,
                     add_inputs: bool, pick: torch.Tensor) -> None:
    """``y[t, slice_i] += x[i][t] @ B_i[slot(t)]^T`` for every token (nothing where ``pick[t]`` is
    0): the row-parallel layers' expand. ``pick`` in ``y``'s dtype; graph-safe as above."""
    tokens = y.shape[0]
    offset = offset_start
    for i, b in enumerate(lora_b_stacked):
        width = output_slices[i]
        slots, _, _, rank = b.shape
        xi = x[i][:, :rank]
        if xi.dtype != y.dtype:
            xi = xi.to(y.dtype)
        spread = (pick.unsqueeze(2) * xi.unsqueeze(1)).view(tokens, slots * rank)
        _spread_expand(y[:, offset:offset + width], spread, b, width, add_inputs)
        offset += width


def _masked_shrink(xc: torch.Tensor, a: torch.Tensor, pick: torch.Tensor) -> torch.Tensor:
    """``[tokens, slots x rank]``: x against every slot's A, each token keeping its slot's columns."""
    slots, _, rank, hidden = a.shape
    w = a.reshape(slots * rank, hidden)  # a view: the stacked weights are contiguous
    if w.dtype != xc.dtype:
        w = w.to(xc.dtype)
    every = torch.mm(xc, w.t()).view(xc.shape[0], slots, rank)
    return (every * pick.unsqueeze(2)).view(xc.shape[0], slots * rank)


def _spread_expand(cols: torch.Tensor, spread: torch.Tensor, b: torch.Tensor, width: int,
                   add_inputs: bool) -> None:
    """``cols += spread @ [B_0; B_1; ...]`` with the slots' B side by side along the inner
    dimension (a copy: B is stored ``[slots, width, rank]``, which no view turns into this)."""
    slots, _, _, rank = b.shape
    w = b[:, 0, :width, :].transpose(1, 2).reshape(slots * rank, width)
    if w.dtype != cols.dtype:
        w = w.to(cols.dtype)
    if not add_inputs:
        cols.zero_()
    if cols.is_cuda:
        cols.addmm_(spread, w)  # fp32 accumulator added and rounded once, as Punica's kernel
    else:
        cols += torch.mm(spread, w)  # product rounded, then the sum, as the stock CPU op


def one_hot(slot: torch.Tensor, slots: int, dtype) -> torch.Tensor:
    """``[tokens, slots]``: 1 at each token's slot, a row of 0 for ``slot < 0`` (no adapter);
    slots out of range also give 0 rather than an index error."""
    ids = torch.arange(slots, device=slot.device)
    return (slot.unsqueeze(1) == ids.unsqueeze(0)).to(dtype)


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
_counts = {"dense": 0, "all_slots": 0, "punica": 0, "base": 0}
_counts_lock = threading.Lock()
# The ops find their wrapper through a tensor the wrapper owns (its `_token_lora_indices`),
# passed as an argument: a compiled graph takes tensors as inputs at every call, but bakes a
# Python int in as a constant, and torch.compile's cache hands an engine rebuilt in the same
# process the graph compiled for the first one (vLLM 0.33 on the H200: the forced rebuild
# failed with a KeyError on the first engine's key). Address -> wrapper, weak, so a closed
# engine's wrapper goes; the owner is checked, since an address can be reused.
_wrappers: weakref.WeakValueDictionary[int, object] = weakref.WeakValueDictionary()


def _owner(indices: torch.Tensor):
    wrapper = _wrappers.get(indices.data_ptr())
    if wrapper is None or wrapper._token_lora_indices.data_ptr() != indices.data_ptr():
        raise RuntimeError("dense_lora: no live Punica wrapper owns this mapping buffer")
    return wrapper


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


GRAPH_MODES = ("on", "off", "always")


def graph_mode() -> str:
    """`VIDLORA_DENSE_LORA_GRAPHS`: what a captured CUDA graph applies (module docstring)."""
    mode = os.environ.get("VIDLORA_DENSE_LORA_GRAPHS", "off")
    if mode not in GRAPH_MODES:
        raise ValueError(f"VIDLORA_DENSE_LORA_GRAPHS={mode!r}: expected one of {', '.join(GRAPH_MODES)}")
    return mode


def _capturing(x: torch.Tensor) -> bool:
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


def _dense_segments(wrapper, x: torch.Tensor):
    """The runs to apply densely for this call, or None for Punica."""
    plan = getattr(wrapper, "_vidlora_plan", None)
    if plan is None or not _enabled or plan.n_tokens != x.shape[0] or _capturing(x):
        return None
    return plan.segments


def _compute_dtype(x: torch.Tensor):
    # The CPU's stock op computes the shrink in fp32; the GPU's accumulates in fp32 and its
    # expand rounds the result to the weights' dtype, which one bf16 GEMM does too.
    return torch.float32 if x.device.type == "cpu" else x.dtype


# The one-hot slot rows the all-slots form reads, one persistent buffer per dtype it may need.
_PICK_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _refresh_picks(wrapper, n_tokens: int, slots: int) -> None:
    """Rewrite the first ``n_tokens`` one-hot rows from vLLM's ``_token_lora_indices`` (just
    written by ``update_metadata``). Runs eagerly before each step, so a captured graph, which
    reads these buffers at the address they had at capture, sees this step's mapping. The
    buffers are made once, at the first mapping (before vLLM captures anything)."""
    if wrapper._vidlora_graph_mode == "off":
        return
    indices = getattr(wrapper, "_token_lora_indices", None)
    if indices is None:
        return
    picks = wrapper._vidlora_picks
    if picks is None:
        picks = wrapper._vidlora_picks = {
            dt: torch.zeros(indices.shape[0], slots, dtype=dt, device=indices.device) for dt in _PICK_DTYPES}
    elif picks[torch.float32].shape[1] != slots:  # never seen: the slot count is fixed per engine
        log.error("dense_lora: slot count changed from %d to %d; Punica runs every step from now on",
                  picks[torch.float32].shape[1], slots)
        wrapper._vidlora_graph_mode = "off"
        return
    hot = one_hot(indices[:n_tokens], slots, torch.float32)
    for buf in picks.values():
        buf[:n_tokens].copy_(hot)


def _pick(wrapper, x: torch.Tensor, dtype, slots: int):
    """This call's one-hot slot rows when it takes the all-slots form (a graph being captured,
    or every call under ``always``), else None."""
    if not _enabled:
        return None
    mode = getattr(wrapper, "_vidlora_graph_mode", "off")
    if mode == "off" or (mode == "on" and not _capturing(x)):
        return None
    picks = getattr(wrapper, "_vidlora_picks", None)
    if not picks or dtype not in picks or picks[dtype].shape[0] < x.shape[0] or picks[dtype].shape[1] != slots:
        return None
    return picks[dtype][: x.shape[0]]


def _linear(wrapper, y: torch.Tensor, x: torch.Tensor, lora_a, lora_b, scale: float, output_slices,
            add_inputs: bool) -> None:
    """One LoRA linear (shrink and expand): the all-slots form, or the stock method, which
    reaches the per-run dense path or Punica through `_shrink` / `_expand`."""
    x2 = x.view(-1, x.shape[-1])
    pick = _pick(wrapper, x2, _compute_dtype(x2), lora_a[0].shape[0])
    if pick is None:
        kw = {} if add_inputs else {"add_inputs": False}  # 0.26/0.32 take no add_inputs here
        type(wrapper)._vidlora_stock_linear(wrapper, y, x, tuple(lora_a), tuple(lora_b), scale,
                                            tuple(output_slices), **kw)
        return
    _count("all_slots")
    # The GPU's stock expand adds (0.26 ignores add_inputs; 0.33 writes only when LoRA runs on
    # its own stream into zeros, where adding is the same); the CPU's honours it.
    all_slots_linear(y.view(-1, y.shape[-1]), x2, lora_a, lora_b, scale, output_slices,
                     add_inputs or y.is_cuda, pick)


def _shrink(wrapper, y, x: torch.Tensor, lora_a, scale: float) -> None:
    x2 = x.view(-1, x.shape[-1])
    compute = _compute_dtype(x2)
    pick = _pick(wrapper, x2, compute, lora_a[0].shape[0])
    if pick is not None:
        _count("all_slots")
        all_slots_shrink(y, x2, lora_a, scale, pick)
        return
    segments = _dense_segments(wrapper, x2)
    if segments is None:
        _count("punica")
        type(wrapper).add_shrink.__vidlora_orig__(wrapper, y, x, tuple(lora_a), scale)
        return
    _count("dense" if segments else "base")
    dense_shrink(y, x2, lora_a, scale, segments, compute)


def _expand(wrapper, y: torch.Tensor, x, lora_b, output_slices, offset_start: int, add_inputs: bool) -> None:
    y2 = y.view(-1, y.shape[-1])
    add = add_inputs or y.is_cuda  # as in `_linear`
    pick = _pick(wrapper, y2, y.dtype, lora_b[0].shape[0])
    if pick is not None:
        all_slots_expand(y2, x, lora_b, output_slices, offset_start, add, pick)
        return
    segments = _dense_segments(wrapper, y2)
    if segments is None:  # counted once per module application, at its shrink
        type(wrapper).add_expand.__vidlora_orig__(wrapper, y, x, tuple(lora_b), tuple(output_slices),
                                                  offset_start=offset_start, add_inputs=add_inputs)
        return
    dense_expand(y2, x, lora_b, output_slices, offset_start, add, segments)


def _linear_op(y: torch.Tensor, x: torch.Tensor, lora_a: list[torch.Tensor], lora_b: list[torch.Tensor],
               scale: float, output_slices: list[int], add_inputs: bool, owner: torch.Tensor) -> None:
    _linear(_owner(owner), y, x, lora_a, lora_b, scale, output_slices, add_inputs)


def _shrink_op(y: torch.Tensor, x: torch.Tensor, lora_a: list[torch.Tensor], scale: float,
               owner: torch.Tensor) -> None:
    _shrink(_owner(owner), y, x, lora_a, scale)


def _expand_op(y: torch.Tensor, x: torch.Tensor, lora_b: list[torch.Tensor], output_slices: list[int],
               offset_start: int, add_inputs: bool, owner: torch.Tensor) -> None:
    _expand(_owner(owner), y, x, lora_b, output_slices, offset_start, add_inputs)


def _noop(*args, **kwargs) -> None:
    return None


_ops: dict[str, object] = {}


def _register_ops() -> None:
    """`vidlora::lora_shrink` / `lora_expand` / `lora_linear`, opaque to torch.compile."""
    if _ops:
        return
    from torch.library import Library

    from vllm.utils.torch_utils import direct_register_custom_op

    lib = Library("vidlora", "FRAGMENT")
    _ops["lib"] = lib  # the ops live as long as the library object
    direct_register_custom_op("lora_shrink", _shrink_op, mutates_args=["y"], fake_impl=_noop, target_lib=lib)
    direct_register_custom_op("lora_expand", _expand_op, mutates_args=["y"], fake_impl=_noop, target_lib=lib)
    direct_register_custom_op("lora_linear", _linear_op, mutates_args=["y"], fake_impl=_noop, target_lib=lib)


def _wrap_update_metadata(orig):
    @wraps_marked(orig)
    def update_metadata(self, mapping, lora_index_to_id, *args, **kwargs):
        orig(self, mapping, lora_index_to_id, *args, **kwargs)
        try:
            self._vidlora_plan = plan_for(mapping.index_mapping, lora_index_to_id, max_segments())
        except Exception:  # noqa: BLE001 - an unexpected mapping shape keeps Punica
            log.exception("dense_lora: cannot plan this mapping; Punica runs it")
            self._vidlora_plan = None
        _refresh_picks(self, len(mapping.index_mapping), len(lora_index_to_id))
    return update_metadata


def _wrap_init(orig):
    # Registered here, outside any compiled region (see `_wrappers`).
    @wraps_marked(orig)
    def __init__(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        self._vidlora_plan = None
        self._vidlora_graph_mode = graph_mode()
        self._vidlora_picks = None
        _wrappers[self._token_lora_indices.data_ptr()] = self
    return __init__


# Buffers come as one stacked tensor (the GPU wrapper, row-parallel layers) or, from the CPU
# wrapper's add_lora_linear, as a tuple of per-slice tensors. A tuple is only ever seen on the
# CPU, where nothing is compiled, so it takes the Python path directly; a tensor goes through
# the op, whose body is where a compiled graph still runs Python.
def _wrap_add_shrink(orig):
    @wraps_marked(orig)
    def add_shrink(self, y, x, lora_a_stacked, scale, **kwargs):
        if isinstance(y, torch.Tensor):
            torch.ops.vidlora.lora_shrink(y, x, list(lora_a_stacked), float(scale), self._token_lora_indices)
        else:
            _shrink(self, y, x, lora_a_stacked, scale)
    return add_shrink


def _wrap_add_expand(orig):
    @wraps_marked(orig)
    def add_expand(self, y, x, lora_b_stacked, output_slices, offset_start=0, add_inputs=True, **kwargs):
        if isinstance(x, torch.Tensor):
            torch.ops.vidlora.lora_expand(y, x, list(lora_b_stacked), [int(s) for s in output_slices],
                                          int(offset_start), bool(add_inputs), self._token_lora_indices)
        else:
            _expand(self, y, x, lora_b_stacked, output_slices, offset_start, add_inputs)
    return add_expand


def _wrap_add_lora_linear(orig):
    @wraps_marked(orig)
    def add_lora_linear(self, y, x, lora_a_stacked, lora_b_stacked, scale, output_slices, *, buffer=None,
                        **kwargs):
        # Off (the default), a caller's own buffer or options: the stock method, whose shrink and
        # expand are the ops above, exactly as before the all-slots form existed. The mode is fixed
        # per wrapper, so torch.compile may freeze this test.
        if self._vidlora_graph_mode == "off" or buffer is not None or set(kwargs) - {"add_inputs"}:
            return orig(self, y, x, lora_a_stacked, lora_b_stacked, scale, output_slices, buffer=buffer, **kwargs)
        add_inputs = bool(kwargs.get("add_inputs", True))
        if y.is_cuda:
            torch.ops.vidlora.lora_linear(y, x, list(lora_a_stacked), list(lora_b_stacked), float(scale),
                                          [int(s) for s in output_slices], add_inputs, self._token_lora_indices)
        else:
            _linear(self, y, x, lora_a_stacked, lora_b_stacked, scale, output_slices, add_inputs)
        return None
    return add_lora_linear


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
        graph_mode()
    except ValueError as exc:  # said at apply, not at the engine's first capture
        return str(exc)
    try:
        from vllm.utils.torch_utils import direct_register_custom_op  # noqa: F401
    except ImportError:
        return "vllm.utils.torch_utils.direct_register_custom_op not present"
    targets = _targets()
    if not targets:
        return "no Punica wrapper importable"
    for cls in targets:
        for name in ("__init__", "update_metadata", "add_shrink", "add_expand", "add_lora_linear"):
            if not callable(getattr(cls, name, None)):
                return f"{cls.__name__}.{name} missing: layout differs from 0.26-0.34"
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
        # Kept by name: a test (or another patch) may wrap add_lora_linear again around ours.
        cls._vidlora_stock_linear = cls.add_lora_linear
        cls.add_lora_linear = _wrap_add_lora_linear(cls.add_lora_linear)


PATCH = Patch(
    name="dense_lora",
    covers="issue 14: one-adapter (or few-run) steps apply LoRA with dense GEMMs instead of Punica",
    probe=probe,
    apply=apply,
)
