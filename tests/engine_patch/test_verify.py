"""engine_patch.verify: the comparison logic (fast) and the CLI on the tiny model (engine).

The CLI runs in a subprocess: --no-patch must not see patches the plugin or another test
applied in this interpreter, and each run builds several engines.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine_patch.verify import Options, compare, compare_generation, make_prompt, tolerance
from engine_patch.verify.video import InputMismatch, check_same_input

from tests.support.tiny import REPO, full_adapters, tiny_model


def test_compare_mean_max_agreement():
    a = {"lp": [-1.0, -2.0, -3.0], "top": [1, 2, 3]}
    b = {"lp": [-1.1, -2.0, -2.5], "top": [1, 9, 3]}
    c = compare(a, b)
    assert c["n"] == 3 and c["finite"]
    assert math.isclose(c["mean"], 0.2) and math.isclose(c["max"], 0.5)
    assert math.isclose(c["agree"], 2 / 3)
    assert compare(a, {"lp": [-1.0, float("nan"), -3.0], "top": [1, 2, 3]})["finite"] is False


def test_tolerance_is_k_times_noise_with_floors():
    o = Options(model=None, adapters=[])  # type: ignore[arg-type]
    assert tolerance(0.001, 0.01, o) == (o.floor_mean, o.floor_max)
    assert tolerance(0.1, 1.0, o) == (o.k * 0.1, o.k * 1.0)
    assert tolerance(None, None, o) == (o.floor_mean, o.floor_max)


def test_generation_may_part_only_at_a_near_tie():
    single = {"tokens": [1, 2, 3, 4], "lp": [-0.1] * 4, "margin": [2.0, 0.01, 2.0, 2.0],
              "second": [9, 7, 9, 9], "second_lp": [-2.1, -0.11, -2.1, -2.1]}
    same = {"tokens": [1, 2, 3, 4], "lp": [-0.1] * 4, "margin": [2.0] * 4}
    assert compare_generation(single, same, 0.02, 0.25)["ok"]
    tie = {"tokens": [1, 7, 8, 9], "lp": [-0.1, -0.1, -0.1, -0.1], "margin": [2.0] * 4}
    r = compare_generation(single, tie, 0.02, 0.25)
    assert r["ok"] and r["diverge_at"] == 1 and r["near_tie"]
    decisive = {"tokens": [5, 6, 7, 8], "lp": [-3.0] * 4, "margin": [2.0] * 4}
    not_runner_up = {"tokens": [1, 8, 8, 9], "lp": [-0.1, -0.11, -0.1, -0.1], "margin": [2.0] * 4}
    assert not compare_generation(single, not_runner_up, 0.02, 0.25)["ok"]
    scored_differently = {"tokens": [1, 7, 8, 9], "lp": [-0.1, -1.5, -0.1, -0.1], "margin": [2.0] * 4}
    assert not compare_generation(single, scored_differently, 0.02, 0.25)["ok"]
    assert not compare_generation(single, decisive, 0.02, 0.25)["ok"]
    shifted = {"tokens": [1, 2, 3, 4], "lp": [-0.1, -0.1, -1.5, -0.1], "margin": [2.0] * 4}
    assert not compare_generation(single, shifted, 0.02, 0.25)["ok"]


def test_prompts_have_exact_lengths():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model() / "base"))
    for n in (16, 127, 128, 129, 450, 2048):
        assert len(make_prompt(tok, n)) == n
    assert make_prompt(tok, 64, offset=1) != make_prompt(tok, 64)


def test_input_mismatch_names_the_first_differing_token():
    check_same_input([1, 2, 3], [1, 2, 3])
    with pytest.raises(InputMismatch, match=r"at position 2: vLLM \[1, 2, 9, 4\].*reference \[1, 2, 3, 4\]"):
        check_same_input([1, 2, 3, 4], [1, 2, 9, 4])
    with pytest.raises(InputMismatch, match=r"\(transformers AutoProcessor, 2 tokens\).*\(3 tokens\) at position 2"):
        check_same_input([1, 2], [1, 2, 3])


def text_prefix_adapter(src: Path, dst: Path) -> Path:
    """`src` with the text-only model's key prefix (base_model.model.model.layers.*), as an
    adapter trained on Qwen3.5's language model alone is saved: PEFT cannot place those keys
    on the vision-language class, the registry maps them onto the checkpoint's."""
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True, exist_ok=True)
    sd = load_file(str(src / "adapter_model.safetensors"))
    renamed = {k.replace("model.language_model.", "model."): v for k, v in sd.items()}
    assert renamed.keys() != sd.keys() and all(".language_model." not in k for k in renamed)
    save_file(renamed, str(dst / "adapter_model.safetensors"))
    (dst / "adapter_config.json").write_text((src / "adapter_config.json").read_text())
    return dst


def _verify(tmp_path, *extra: str, timeout: int = 600, adapters: list[Path] | None = None,
            env: dict[str, str] | None = None) -> tuple[int, dict, str]:
    root = tiny_model()
    out = tmp_path / "verify.json"
    cmd = [sys.executable, "-m", "engine_patch.verify", "--model", str(root / "base"),
           "--max-new-tokens", "8", "--json", str(out), *extra]
    for a in adapters if adapters is not None else full_adapters(root):
        cmd += ["--adapter", str(a)]
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", PYTHONPATH=str(REPO), **(env or {}))
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.exists(), proc.stderr[-3000:]
    return proc.returncode, json.loads(out.read_text()), proc.stdout


@pytest.mark.engine
def test_verify_passes_on_every_tiny_adapter(tmp_path):
    rc, res, stdout = _verify(tmp_path, "--lengths", "16,127,128,129,450")
    assert rc == 0, (res["failures"], res["errors"])
    assert res["ok"] and "lora_index_mask" in res["patches"]
    checks = [r for r in res["rows"] if r["pair"] == "dyn~ref"]
    assert len(checks) == 3 * 5 and all(r["ok"] for r in checks)
    assert {r["pair"] for r in res["rows"]} >= {"base~base_ref", "merged~ref", "dyn~merged", "dyn~base"}
    assert len(res["mixed"]) == 9 and all(m["ok"] for m in res["mixed"])
    assert res["long_short"] and all(e["ok"] for e in res["long_short"])
    # (d) the no-adapter request on the LoRA engine (alone, co-batched) vs an engine without LoRA.
    nolora = [r for r in res["rows"] if r["pair"] in ("nolora~lora", "nolora~lora_cobatched")]
    assert len(nolora) == 2 * 5 and all(r["ok"] and r["diverge_at"] is None for r in nolora), nolora
    assert res["tolerance"]["k"] > 1 and "VERIFY PASS" in stdout
    # Both LoRA paths ran: dense for one-adapter steps, Punica for the 5-run mixed batch.
    assert res["lora_paths"]["dense"] > 0 and res["lora_paths"]["punica"] > 0, res["lora_paths"]


@pytest.mark.engine
def test_verify_passes_with_the_dense_path_switched_off(tmp_path):
    """VIDLORA_DENSE_LORA=off: every other patch, Punica for every step, still == merged."""
    rc, res, stdout = _verify(tmp_path, "--checks", "a", "--lengths", "16,450", env={"VIDLORA_DENSE_LORA": "off"})
    assert rc == 0, (res["failures"], res["errors"])
    assert "dense_lora" not in res["patches"] and "lora_index_mask" in res["patches"]
    assert "lora_paths" not in res and "VERIFY PASS" in stdout


@pytest.mark.engine
def test_verify_passes_with_every_step_in_the_all_slots_form(tmp_path):
    """VIDLORA_DENSE_LORA_GRAPHS=always: what a CUDA graph captures on the GPU, run here on every
    step of a real engine (the CPU captures nothing): single and mixed batches == merged."""
    rc, res, stdout = _verify(tmp_path, "--checks", "a,b", "--lengths", "16,450",
                              env={"VIDLORA_DENSE_LORA_GRAPHS": "always"})
    assert rc == 0, (res["failures"], res["errors"])
    assert len(res["mixed"]) == 9 and all(m["ok"] for m in res["mixed"])
    paths = res["lora_paths"]
    assert paths["all_slots"] > 0 and paths["dense"] == paths["punica"] == 0, paths


@pytest.mark.engine
def test_verify_without_patch_fails_on_mixed_batch_with_base_requests(tmp_path):
    rc, res, stdout = _verify(tmp_path, "--no-patch", "--checks", "b,d", "--lengths", "16")
    assert rc == 1 and not res["ok"] and res["patches"] == []
    base_in_mixed = [m for m in res["mixed"] if m["batch"] == "with_no_adapter" and m["adapter"] is None]
    assert base_in_mixed and not all(m["generate"]["ok"] for m in base_in_mixed), base_in_mixed
    # (d): alone the no-adapter request is the no-LoRA engine's; beside the adapters it is not (#49063).
    [alone] = [r for r in res["rows"] if r["pair"] == "nolora~lora"]
    [mixed] = [r for r in res["rows"] if r["pair"] == "nolora~lora_cobatched"]
    assert alone["ok"] and not mixed["ok"], (alone, mixed)
    assert any(f.startswith("no-adapter request L=16: the LoRA engine (co-batched with adapters) differs")
               for f in res["failures"])
    assert "VERIFY FAIL" in stdout


@pytest.mark.engine
def test_verify_passes_on_a_text_prefix_adapter(tmp_path):
    """The reference and the merge load the registry's normalised adapter, as vLLM does: with
    the raw one PEFT would place nothing and the reference would be the base model."""
    src = full_adapters(tiny_model())[0]
    adapter = text_prefix_adapter(src, tmp_path / "text_prefix")
    rc, res, stdout = _verify(tmp_path, "--checks", "a", "--lengths", "16,129", adapters=[adapter])
    assert rc == 0, (res["failures"], res["errors"])
    [reg] = res["adapters"]
    assert reg["ok"] and reg["path"].startswith("<workdir>/prepared/text_prefix-"), reg
    checks = [r for r in res["rows"] if r["pair"] == "dyn~ref"]
    assert len(checks) == 2 and all(r["ok"] and not r["inconclusive"] for r in checks), checks
    sanity = [r for r in res["rows"] if r["pair"] == "merged~ref"]
    assert sanity and all(r["ok"] for r in sanity)
    assert not res["inconclusive"] and "VERIFY PASS" in stdout


@pytest.mark.engine
def test_verify_refused_adapter_is_a_failure_with_its_reason(tmp_path):
    bad = tmp_path / "not_an_adapter"
    bad.mkdir()
    rc, res, stdout = _verify(tmp_path, "--checks", "a", "--lengths", "16", adapters=[bad])
    assert rc == 1 and not res["ok"] and not res["errors"]
    [row] = res["rows"]
    assert row["pair"] == "registration" and not row["ok"] and "adapter_config.json" in row["reason"]
    assert any("refused by the adapter registry" in f for f in res["failures"]) and "VERIFY FAIL" in stdout


@pytest.mark.engine
def test_verify_video_mode_on_the_worker_request(tmp_path):
    adapter = full_adapters(tiny_model())[0]
    rc, res, stdout = _verify(tmp_path, "--video", "--video-frames", "4", "--video-max-pixels", str(128 * 128),
                              adapters=[adapter])
    assert rc == 0, (res["failures"], res["errors"])
    video = res["video"]
    assert video["frames"] == 4 and video["width"] * video["height"] <= 128 * 128 and video["video_tokens"] > 0
    assert all(r["mode"] == "video" for r in res["rows"])
    cont = [r for r in res["rows"] if r["positions"] == "continuation"]
    assert {r["pair"] for r in cont} >= {"base~base_ref", "merged~ref", "dyn~ref", "dyn~merged", "dyn~base"}
    [check] = [r for r in cont if r["pair"] == "dyn~ref"]
    assert check["ok"] and not check["inconclusive"] and check["n"] == 8 and check["role"] == "check"
    assert check["length"] == video["prompt_tokens"]
    assert any(r["positions"] == "text" and r["pair"] == "dyn~ref" for r in res["rows"])
    assert "VERIFY PASS" in stdout
