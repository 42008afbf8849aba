"""Admission to a streaming engine: at most max_loras adapters in flight, running adapters
refilled first, a free slot to the resident or the oldest adapter, nobody starves, and what
is admitted is grouped by adapter."""
from __future__ import annotations

from vidlora.admission import Waiting, admit, concurrency


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


def test_concurrency_follows_the_kv_cache_for_the_request_shape():
    assert concurrency(256, kv_tokens=1_000_000, tokens_per_request=2_128) == 256
    assert concurrency(256, kv_tokens=100_000, tokens_per_request=2_128) == 46
    assert concurrency(256, kv_tokens=None, tokens_per_request=600) == 256
    assert concurrency(256, kv_tokens=1_000_000, tokens_per_request=600, limit=64) == 64
    assert concurrency(16, kv_tokens=10, tokens_per_request=600) == 1
