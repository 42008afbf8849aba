"""Whether a GPU worker's engine fits the batch its settings ask for, and what would, in words.

The worker publishes what its engine runs at once and why (``tasks.gpu_stream.StreamRunner``:
the cache blocks the weights left, and the blocks one analysis holds, read from vLLM). On an
80 GB card a 27B model in bf16 leaves room for ~64 of the 256 sequences asked for; FP8 weights
take half the memory and triple that (bench/results/fit_80gb.md). ``vidlora doctor`` says so.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Below this share of max_num_seqs the cache, not the setting, sets the batch: worth saying.
CACHE_BOUND_SHARE = 0.5


@dataclass(frozen=True)
class Fit:
    ok: bool
    detail: str
    fix: str = ""


def engine_fit(stream: dict[str, Any] | None) -> Fit | None:
    """The verdict for one worker's heartbeat ``stream``; None where it published no layout."""
    memory = (stream or {}).get("memory")
    if not memory:
        return None
    asked = int(memory.get("max_num_seqs") or 0)
    runs = int(memory.get("requests") or 0)
    weights = str(memory.get("weights") or "unknown")
    per = memory.get("bytes_per_request") or {}
    held = ", ".join(f"{_mb(v)} {'GDN state' if k == 'state' else 'KV'}" for k, v in sorted(per.items(), reverse=True))
    detail = (f"runs {runs} analyses at once of the {asked} max_num_seqs asks for: {weights} weights leave "
              f"{memory.get('num_blocks')} cache blocks of {_mb(memory.get('block_bytes') or 0)}, and one "
              f"analysis of {memory.get('tokens_per_request')} tokens holds {memory.get('blocks_per_request')} "
              f"({held})")
    if runs >= asked * CACHE_BOUND_SHARE:
        return Fit(True, detail)
    if weights != "fp8":
        fix = ("serve FP8 weights: a checkpoint published in FP8 (e.g. Qwen3.6-27B-FP8) as VIDLORA_MODEL, or "
               "VIDLORA_QUANTIZATION=fp8 for this bf16 one; the weights take half and the cache left holds "
               "about 3x the analyses (docs/deploy.md, 'An 80 GB card')")
    else:
        fix = ("the cache, not max_num_seqs, sets the batch: VIDLORA_KV_CACHE_DTYPE=fp8, fewer adapter slots "
               "(VIDLORA_MAX_LORAS), or a card with more memory; or lower VIDLORA_MAX_NUM_SEQS to what runs")
    return Fit(False, detail, fix)


def _mb(n: float) -> str:
    return f"{n / 1e6:,.0f} MB" if n >= 1e6 else f"{n / 1e3:,.0f} kB"
