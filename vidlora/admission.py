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


@dataclass(frozen=True)
class CacheGroup:
    """Layers of the engine that take cache blocks together (one of vLLM's KV-cache groups)."""
    kind: str          # "attention": blocks grow with the tokens; "state": a GDN/Mamba recurrent state
    block_tokens: int  # tokens one block covers (a state group's is max_model_len: one block a request)
    layers: int


@dataclass(frozen=True)
class EngineMemory:
    """The engine's cache as vLLM laid it out (``workers.engine_host.EngineHost.engine_memory``).

    On a hybrid model every group draws its blocks from one pool, and a block id is one page
    in each layer of a group: a request of T tokens holds ceil(T / block_tokens) blocks of each
    attention group and one block of each state group (its recurrent state) for as long as it
    runs. On the 27B (48 GDN layers in three state groups, 16 attention layers) the state is
    three of the five to eight blocks a video request holds: counting tokens alone admits
    four times what the engine can run (issue 45)."""
    num_blocks: int
    block_bytes: int
    groups: tuple[CacheGroup, ...]
    max_num_seqs: int

    def blocks_per_request(self, tokens: int) -> int:
        return sum(-(-max(1, int(tokens)) // g.block_tokens) for g in self.groups)

    def bytes_per_request(self, tokens: int) -> dict[str, int]:
        """The cache bytes one request of ``tokens`` holds, by group kind."""
        out: dict[str, int] = {}
        for g in self.groups:
            out[g.kind] = out.get(g.kind, 0) + -(-max(1, int(tokens)) // g.block_tokens) * self.block_bytes
        return out

    def requests(self, tokens: int) -> int:
        """How many requests of ``tokens`` the engine runs at once: its sequence cap, bounded by
        the blocks they hold at their longest (vLLM's block pool keeps one null block)."""
        fit = (self.num_blocks - 1) // max(1, self.blocks_per_request(tokens))
        return max(1, min(int(self.max_num_seqs), fit))

    def as_dict(self, tokens: int) -> dict[str, object]:
        """What the worker logs and publishes about its capacity."""
        return {"num_blocks": self.num_blocks, "block_bytes": self.block_bytes,
                "groups": [f"{g.kind}:{g.layers}x{g.block_tokens}" for g in self.groups],
                "tokens_per_request": int(tokens), "blocks_per_request": self.blocks_per_request(tokens),
                "bytes_per_request": self.bytes_per_request(tokens), "requests": self.requests(tokens)}


def concurrency(max_num_seqs: int, memory: EngineMemory | None, tokens_per_request: int, limit: int = 0) -> int:
    """How many requests the stream keeps in the engine: as many as the engine runs at once for
    the request shape (its cache, read from the engine: ``EngineMemory.requests``), else its
    sequence cap; ``limit`` > 0 caps it further."""
    n = max(1, int(max_num_seqs))
    if memory is not None and tokens_per_request > 0:
        n = min(n, memory.requests(tokens_per_request))
    return min(n, limit) if limit > 0 else n


def backlog(capacity: int, message_size: int) -> int:
    """Analyses a streaming worker claims beyond what its engine runs: a tenth of the engine
    (so a finished request is replaced at once), at most one dispatch message. The rest stay
    in the broker, claimable by other workers, instead of waiting on this one with their
    deadlines running."""
    return max(1, min(int(message_size), -(-int(capacity) // 10)))


def request_tokens(sampling: Mapping[str, object], max_tokens: int) -> int:
    """Engine tokens (video + prompt + answer) one analysis of a scenario takes at most, from
    its sampling policy (``vidlora.media.sampling.SamplingPolicy`` fields and defaults)."""
    from vidlora.engine_batches import PROMPT_OVERHEAD_TOKENS, TEMPORAL_PATCH, TOKEN_PIXELS

    frames = int(sampling.get("num_frames", 16) if sampling.get("mode", "uniform") == "uniform"
                 else sampling.get("max_frames", 32))
    per_group = int(sampling.get("max_pixels", 448 * 448)) // TOKEN_PIXELS
    return -(-frames // TEMPORAL_PATCH) * per_group + PROMPT_OVERHEAD_TOKENS + int(max_tokens)
