"""Failure 1: a GDN adapter with `in_proj_z` but no `in_proj_qkv` crashes the step.

`in_proj_qkvz` is one MergedColumnParallelLinear with 4 slices [q|k|v|z] fed by two
PEFT members [in_proj_qkv (3 slices) | in_proj_z (1 slice)]. Upstream
`MergedColumnParallelLinearWithLoRA.expand_packed_lora` (0.32, #47639) maps members to
slices greedily and lets a missing (None) member swallow *all remaining* slices, which
is right only when the missing member trails. A z-only adapter ([None, z]) therefore
raises `Cannot determine how to split lora_b ... starting from index 4`.

The replacement solves the assignment exactly: it enumerates the ways to split the
n slices into len(groups) contiguous runs, keeps those where every present member's
row count equals its run's total size, and takes the unique answer (ties, only
possible with two missing members, follow the packed-module convention: the leading
member covers the most slices). Missing members become None slices, which `set_lora`
leaves at the zeros `reset_lora` wrote, so their delta is exactly zero.
"""
from __future__ import annotations

import torch

from .base import Patch, is_marked, wraps_marked

_CLS_PATH = "vllm.lora.layers.column_parallel_linear"


def solve_runs(output_sizes: list[int], rows: list[int | None]) -> list[int]:
    """Slices covered by each member; raises ValueError when no split fits."""
    n, g = len(output_sizes), len(rows)
    found: list[list[int]] = []

    def rec(i: int, start: int, acc: list[int]) -> None:
        if i == g:
            if start == n:
                found.append(list(acc))
            return
        for c in range(1, n - start - (g - i - 1) + 1):
            r = rows[i]
            if r is not None and r != sum(output_sizes[start : start + c]):
                continue
            acc.append(c)
            rec(i + 1, start + c, acc)
            acc.pop()

    rec(0, 0, [])
    if not found:
        raise ValueError(
            f"Cannot place LoRA members with rows {rows} onto packed slices {output_sizes}"
        )
    # Deterministic tie-break: leading member takes the most slices (qkv before z).
    return max(found)


def expand_packed_lora(self, lora_a, lora_b):
    rows = [None if b is None else int(b.shape[0]) for b in lora_b]
    runs = solve_runs(list(self.output_sizes), rows)
    expanded_a: list[torch.Tensor | None] = []
    expanded_b: list[torch.Tensor | None] = []
    start_idx = 0
    for a_i, b_i, covered in zip(lora_a, lora_b, runs):
        if b_i is None:
            expanded_a.extend([None] * covered)
            expanded_b.extend([None] * covered)
        else:
            start = 0
            for j in range(covered):
                size = self.output_sizes[start_idx + j]
                expanded_b.append(b_i[start : start + size, :])
                expanded_a.append(a_i)
                start += size
        start_idx += covered
    return expanded_a, expanded_b


class _Probe:
    output_sizes = [2, 2, 4, 4]
    n_slices = 4


def probe() -> str | None:
    import importlib

    try:
        mod = importlib.import_module(_CLS_PATH)
    except ImportError:
        return f"{_CLS_PATH} not present"
    cls = getattr(mod, "MergedColumnParallelLinearWithLoRA", None)
    fn = getattr(cls, "expand_packed_lora", None)
    if fn is None:
        # Older layouts (before packed-group expansion existed) reject 2-member
        # groups on a 4-slice layer outright; nothing to fix in place there, and the
        # adapter loader fills missing members with zeros instead.
        return "no expand_packed_lora in this vLLM (adapter loader zero-fills members)"
    if is_marked(fn):
        return "already applied"
    # Behavioural check: a trailing-only member ([None, z]) must land on slice 3.
    z = torch.ones(4, 1)
    try:
        _, b = fn(_Probe(), [None, torch.ones(1, 3)], [None, z])
    except (ValueError, AttributeError, TypeError, IndexError):
        # 0.32 raises ValueError ("Cannot determine how to split"), 0.26 AttributeError
        # ('NoneType' object has no attribute 'shape'): either way a missing leading member
        # crashes upstream, and the exact split below is needed.
        return None
    if len(b) == 4 and b[3] is not None and all(x is None for x in b[:3]):
        return "upstream expand_packed_lora already places missing leading members"
    return None


def apply() -> None:
    import importlib

    cls = importlib.import_module(_CLS_PATH).MergedColumnParallelLinearWithLoRA
    cls.expand_packed_lora = wraps_marked(cls.expand_packed_lora)(expand_packed_lora)


PATCH = Patch(
    name="packed_groups",
    covers="failure 1: partial packed GDN groups (z-only) crash expand_packed_lora (#47639)",
    probe=probe,
    apply=apply,
)
