"""Admission: which waiting analyses a streaming GPU worker hands its engine now.

Pure functions over plain values; the engine loop (``workers.engine_stream``) gathers them,
this decides. The engine keeps at most ``max_loras`` adapters in device slots; a running set
that needs more makes vLLM swap adapters in and out between steps (a host-to-device copy and a
stall each). So the running set holds at most ``max_loras`` distinct adapters, and a new
adapter takes a slot only when one is free:

- requests of adapters already running are admitted first (they cost no slot);
- a free slot goes to the oldest waiting adapter, but one already resident in the engine's
  slots goes ahead of one that is not, unless the other has waited ``fair_wait_s`` or more;
- when the oldest waiting request has waited ``fair_wait_s`` and its adapter cannot get a slot,
  nothing newer is admitted: the running set drains until a slot frees, so no scenario starves;
- the admitted requests are handed over grouped by adapter, so engine steps keep few adapter
  runs (engine_patch's dense LoRA path takes steps of at most a few runs).

The base model (adapter None) needs no slot.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Waiting:
    key: str                 # the request key (the analysis id)
    adapter: str | None      # None: the base model
    since: float             # when it became ready to run (seconds, any monotonic clock)


def admit(waiting: Sequence[Waiting], running: Mapping[str | None, int], resident: Sequence[str],
          room: int, max_loras: int, now: float, fair_wait_s: float) -> list[Waiting]:
    """The requests to hand the engine now, grouped by adapter (oldest adapter run first)."""
    if room <= 0 or not waiting:
        return []
    active = {a for a, n in running.items() if n > 0 and a is not None}
    queue = sorted(waiting, key=lambda w: (w.since, w.key))
    oldest = queue[0]
    starving = now - oldest.since >= fair_wait_s

    def order(w: Waiting) -> tuple:
        costs_no_slot = w.adapter is None or w.adapter in active
        if costs_no_slot:
            return (0, 0, w.since, w.key)
        overdue = now - w.since >= fair_wait_s
        return (1, 0 if overdue or w.adapter in resident else 1, w.since, w.key)

    chosen: list[Waiting] = []
    blocked = False
    for w in sorted(queue, key=order):
        if len(chosen) >= room:
            break
        if w.adapter is not None and w.adapter not in active:
            if len(active) >= max_loras:
                blocked = blocked or w is oldest
                continue
            active.add(w.adapter)
        chosen.append(w)
    if starving and blocked:
        # Nothing newer than the oldest request may run ahead of it while it waits for a slot.
        chosen = [w for w in chosen if w.since <= oldest.since]
    first_seen: dict[str | None, int] = {}
    for i, w in enumerate(chosen):
        first_seen.setdefault(w.adapter, i)
    return sorted(chosen, key=lambda w: first_seen[w.adapter])


def concurrency(max_num_seqs: int, kv_tokens: int | None, tokens_per_request: int, limit: int = 0) -> int:
    """How many requests the engine can hold at once: its sequence cap (one GDN state slot each),
    bounded by the KV cache for the request shape; ``limit`` > 0 caps it further."""
    n = max(1, int(max_num_seqs))
    if kv_tokens and tokens_per_request > 0:
        n = min(n, max(1, int(kv_tokens) // int(tokens_per_request)))
    return min(n, limit) if limit > 0 else n


def request_tokens(sampling: Mapping[str, object], max_tokens: int) -> int:
    """Engine tokens (video + prompt + answer) one analysis of a scenario takes at most, from
    its sampling policy (``vidlora.media.sampling.SamplingPolicy`` fields and defaults)."""
    from vidlora.engine_batches import PROMPT_OVERHEAD_TOKENS, TEMPORAL_PATCH, TOKEN_PIXELS

    frames = int(sampling.get("num_frames", 16) if sampling.get("mode", "uniform") == "uniform"
                 else sampling.get("max_frames", 32))
    per_group = int(sampling.get("max_pixels", 448 * 448)) // TOKEN_PIXELS
    return -(-frames // TEMPORAL_PATCH) * per_group + PROMPT_OVERHEAD_TOKENS + int(max_tokens)
