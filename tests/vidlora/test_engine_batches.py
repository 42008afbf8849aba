"""vidlora.engine_batches: grouping by adapter, engine-batch caps, waiting, worker affinity."""

from datetime import datetime, timedelta, timezone

from vidlora.engine_batches import (
    ReadyAnalysis, WorkerView, choose_worker, estimate_tokens, group_by_adapter, should_send,
)

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def item(i, adapter, frames=8, w=224, h=224, max_tokens=64, age=0):
    return ReadyAnalysis(i, adapter, frames, w, h, max_tokens, T0 + timedelta(seconds=age))


def test_token_estimate_counts_merged_patches_and_temporal_pairs():
    # 224x224 -> 7x7 tokens per frame pair; 8 frames -> 4 pairs -> 196 video tokens
    assert estimate_tokens(item(1, "a")) == 196 + 256 + 64


def test_groups_never_mix_adapters_and_keep_arrival_order():
    ready = [item(1, "a"), item(2, "b"), item(3, "a", age=-1), item(4, "b")]
    batches = group_by_adapter(ready, max_requests=8, max_tokens=10**6)
    assert [[x.id for x in b] for b in batches["a"]] == [[3, 1]]
    assert [[x.id for x in b] for b in batches["b"]] == [[2, 4]]


def test_request_cap_splits_batches():
    ready = [item(i, "a", age=i) for i in range(5)]
    sizes = [len(b) for b in group_by_adapter(ready, max_requests=2, max_tokens=10**6)["a"]]
    assert sizes == [2, 2, 1]


def test_token_cap_splits_batches_but_never_drops_an_oversized_item():
    ready = [item(1, "a", frames=64, w=1024, h=1024), item(2, "a")]
    batches = group_by_adapter(ready, max_requests=16, max_tokens=1000)["a"]
    assert [[x.id for x in b] for b in batches] == [[1], [2]]


def test_partial_batch_waits_only_while_more_is_coming_and_not_too_long():
    batch = [item(1, "a")]
    assert should_send(batch, 4, more_coming=False, now=T0, max_wait_s=5)
    assert not should_send(batch, 4, more_coming=True, now=T0 + timedelta(seconds=1), max_wait_s=5)
    assert should_send(batch, 4, more_coming=True, now=T0 + timedelta(seconds=6), max_wait_s=5)
    full = [item(i, "a") for i in range(4)]
    assert should_send(full, 4, more_coming=True, now=T0, max_wait_s=5)


def test_affinity_prefers_a_worker_holding_the_adapter_even_if_busier():
    workers = [WorkerView("w1", "gpu.w1", ("a",), 10), WorkerView("w2", "gpu.w2", ("b",), 0)]
    assert choose_worker("a", workers).name == "w1"
    assert choose_worker("c", workers).name == "w2"  # nobody holds it: least loaded
    assert choose_worker("a", []) is None
