"""Engine batches: group ready analyses by adapter into the batches one GPU worker runs as
one engine submission, and pick the worker for each.

"Engine batch" is this unit; a "batch" elsewhere (``vidlora.models.Batch``) is what a user
uploaded. Pure functions over plain values: the dispatch task gathers rows, this decides.

Why group by adapter: vLLM holds at most ``max_loras`` adapters in GPU slots; a batch that
mixes more adapters than slots, or arrival-order traffic over many adapters, makes the
engine swap adapters in and out (each swap is a host-to-device copy and a stall). Sending
one adapter's analyses together, to a worker that already holds it, keeps swaps rare.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

PROMPT_OVERHEAD_TOKENS = 256  # chat template, system and scenario prompt, vision markers
TOKEN_PIXELS = 32 * 32  # Qwen3.5: 16x16 patches merged 2x2 -> one token per 32x32 pixels
TEMPORAL_PATCH = 2  # two consecutive frames share one set of video tokens


@dataclass(frozen=True)
class ReadyAnalysis:
    id: int
    adapter: str  # scenario name; one adapter per scenario
    frames: int
    width: int
    height: int
    max_tokens: int
    ready_since: datetime


@dataclass(frozen=True)
class WorkerView:
    name: str
    queue: str
    adapters: tuple[str, ...]
    in_flight: int


def estimate_tokens(item: ReadyAnalysis) -> int:
    """Upper estimate of the engine tokens (prompt + output) one analysis needs."""
    per_frame_group = (item.width * item.height) // TOKEN_PIXELS
    video_tokens = math.ceil(item.frames / TEMPORAL_PATCH) * per_frame_group
    return video_tokens + PROMPT_OVERHEAD_TOKENS + item.max_tokens


def group_by_adapter(
    ready: list[ReadyAnalysis], max_requests: int, max_tokens: int
) -> dict[str, list[list[ReadyAnalysis]]]:
    """Split each adapter's analyses (oldest first) into batches within both caps."""
    by_adapter: dict[str, list[ReadyAnalysis]] = defaultdict(list)
    for item in sorted(ready, key=lambda r: (r.ready_since, r.id)):
        by_adapter[item.adapter].append(item)
    batches: dict[str, list[list[ReadyAnalysis]]] = {}
    for adapter, items in by_adapter.items():
        current: list[ReadyAnalysis] = []
        tokens = 0
        out: list[list[ReadyAnalysis]] = []
        for item in items:
            need = estimate_tokens(item)
            if current and (len(current) >= max_requests or tokens + need > max_tokens):
                out.append(current)
                current, tokens = [], 0
            current.append(item)
            tokens += need
        if current:
            out.append(current)
        batches[adapter] = out
    return batches


def should_send(
    batch: list[ReadyAnalysis], max_requests: int, more_coming: bool, now: datetime, max_wait_s: float
) -> bool:
    """Send a full batch at once; hold a partial one while more of its adapter is being
    prepared, but never longer than ``max_wait_s``."""
    if len(batch) >= max_requests or not more_coming:
        return True
    oldest = min(item.ready_since for item in batch)
    return (now - oldest).total_seconds() >= max_wait_s


def choose_worker(adapter: str, workers: list[WorkerView]) -> WorkerView | None:
    """A live worker that already holds the adapter (least loaded first); else the least
    loaded worker, which will then hold it. None when no GPU worker is alive."""
    if not workers:
        return None
    holding = [w for w in workers if adapter in w.adapters]
    pool = holding or workers
    return min(pool, key=lambda w: (w.in_flight, w.name))
