"""Admission to a streaming engine: at most max_loras adapters in flight, running adapters
refilled first, a free slot to the resident or the oldest adapter, nobody starves, and what
is admitted is grouped by adapter."""
from __future__ import annotations

from vidlora.admission import CacheGroup, EngineMemory, Waiting, admit, backlog, concurrency


def w(key: str, adapter: str | None, since: float) -> Waiting:
    return Waiting(key, adapter, since)


def keys(chosen) -> list[str]:
    return [c.key for c in chosen]


def test_a_lone_request_on_an_idle_engine_is_admitted_at_once():
    assert keys(admit([w("1", "a", 0.0)], {}, [], room=16, max_loras=4, now=0.0, fair_wait_s=30)) == ["1"]


def test_room_caps_the_admission():
    waiting = [w(str(i), "a", float(i)) for i in range(10)]
    assert keys(admit(waiting, {"a": 5}, ["a"], room=3, max_loras=4, now=10, fair_wait_s=30)) == ["0", "1", "2"]


def test_never_more_adapters_in_flight_than_slots():
    waiting = [w(str(i), f"s{i % 6}", float(i)) for i in range(12)]
    chosen = admit(waiting, {"s0": 1, "s1": 1}, ["s0", "s1"], room=64, max_loras=4, now=12, fair_wait_s=30)
    assert {c.adapter for c in chosen} | {"s0", "s1"} == {"s0", "s1", "s2", "s3"}
    assert len(chosen) == 8


def test_the_base_model_needs_no_slot():
    waiting = [w("1", "x", 0.0), w("2", None, 1.0)]
    assert keys(admit(waiting, {"a": 1}, ["a"], room=8, max_loras=1, now=2, fair_wait_s=30)) == ["2"]


def test_running_adapters_are_refilled_before_a_new_one_takes_a_slot():
    waiting = [w("old-new", "b", 0.0), w("young-running", "a", 5.0)]
    assert keys(admit(waiting, {"a": 3}, ["a"], room=1, max_loras=4, now=6, fair_wait_s=30)) == ["young-running"]


def test_a_resident_adapter_takes_a_free_slot_ahead_of_an_older_cold_one():
    waiting = [w("cold", "c", 0.0), w("warm", "r", 1.0)]
    assert keys(admit(waiting, {}, ["r"], room=8, max_loras=1, now=2, fair_wait_s=30)) == ["warm"]


def test_an_adapter_waiting_past_the_fair_wait_goes_first_and_nothing_newer_overtakes_it():
    waiting = [w("starved", "c", 0.0), w("warm", "r", 1.0), w("running", "a", 40.0)]
    # No free slot: the running set must drain for "c", so the newer "a" request waits too.
    assert keys(admit(waiting, {"a": 2}, ["a", "r"], room=8, max_loras=1, now=45, fair_wait_s=30)) == []
    # A slot frees: the starved adapter takes it ahead of the resident one.
    assert keys(admit(waiting, {}, ["a", "r"], room=8, max_loras=1, now=46, fair_wait_s=30)) == ["starved"]


def test_admitted_requests_are_grouped_by_adapter():
    waiting = [w("a1", "a", 0.0), w("b1", "b", 1.0), w("a2", "a", 2.0), w("n1", None, 3.0), w("b2", "b", 4.0)]
    chosen = admit(waiting, {}, [], room=8, max_loras=4, now=5, fair_wait_s=30)
    assert [c.adapter for c in chosen] == [None, "a", "a", "b", "b"]  # base first, as EngineHost submits


# The 27B (Qwen3.5: 48 GDN layers in three groups of 16, 16 attention layers) as vLLM 0.33 laid
# out its cache on an 80 GB H100 with bf16 weights: 7.98 GiB, one block id = one 1.6 MB page in
# 16 layers; an attention block covers 400 tokens, a state block is one request's GDN state.
H100_BF16_27B = EngineMemory(
    num_blocks=327, block_bytes=16 * 1_638_400,
    groups=(CacheGroup("state", 16384, 16),) * 3 + (CacheGroup("attention", 400, 16),),
    max_num_seqs=256)


def test_a_request_holds_one_state_block_per_gdn_group_and_attention_blocks_by_length():
    assert H100_BF16_27B.blocks_per_request(1) == 4
    assert H100_BF16_27B.blocks_per_request(800) == 5
    assert H100_BF16_27B.blocks_per_request(801) == 6
    per = H100_BF16_27B.bytes_per_request(800)
    assert per == {"state": 3 * 26_214_400, "attention": 2 * 26_214_400}


def test_the_engine_runs_what_its_blocks_hold_not_what_its_tokens_suggest():
    # The video request of the shipped scenarios (~800 engine tokens): vLLM ran ~64 a step on
    # this card. Dividing the pool's tokens (327 x 400) by the request's tokens said 163.
    assert H100_BF16_27B.requests(800) == 65
    assert concurrency(256, H100_BF16_27B, tokens_per_request=800) == 65
    assert 327 * 400 // 800 == 163


def test_the_sequence_cap_and_the_operator_limit_bound_the_capacity():
    roomy = EngineMemory(num_blocks=100_000, block_bytes=1, groups=H100_BF16_27B.groups, max_num_seqs=256)
    assert concurrency(256, roomy, tokens_per_request=800) == 256
    assert concurrency(128, roomy, tokens_per_request=800) == 128
    assert concurrency(256, roomy, tokens_per_request=800, limit=64) == 64


def test_without_a_readable_layout_the_sequence_cap_stands_and_an_engine_always_takes_one():
    assert concurrency(256, None, tokens_per_request=600) == 256
    tiny = EngineMemory(num_blocks=3, block_bytes=1, groups=H100_BF16_27B.groups, max_num_seqs=16)
    assert concurrency(16, tiny, tokens_per_request=600) == 1


def test_a_worker_claims_a_tenth_of_its_engine_beyond_it_at_most_one_message():
    assert backlog(65, message_size=16) == 7
    assert backlog(256, message_size=16) == 16
    assert backlog(1, message_size=16) == 1
