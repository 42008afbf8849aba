"""LLaMA-Factory's form of a training export (``vidlora/feedback/llamafactory.py``).

The check that matters runs LLaMA-Factory 0.9.5 itself, in its own venv
(``scripts/install-llamafactory.sh``, run by ``scripts/test.sh``), on an export that
``vidlora export-training`` wrote from reviewed results: its argument parser on the export's
recipe, its template, its ``get_dataset`` and its collator's video tensors. Every example must
come out as exactly the prompt tokens the vLLM engine makes of the GPU worker's request for the
same result, with the engine's frames. The recipe as it stood before (``template: qwen3_5`` on
``train.jsonl``) is run beside it and does not.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.support.cli import vidlora
from tests.support.structured import seed_structured
from tests.support.tiny import REPO, tiny_model
from vidlora.feedback.llamafactory import VideoGeometry, frame_groups, row

LF_PYTHON = REPO / ".venv-llamafactory" / "bin" / "python"
BRONZE = {"sealed": True, "finds": [{"material": "bronze", "period": "han", "confidence": 0.8,
                                     "decoration": "饕餮 mask, two handles"}]}
SYSTEM = "You are an archaeologist describing what the camera shows."


def test_each_patch_of_two_frames_gets_the_time_the_engine_writes_for_it():
    groups = frame_groups(["a", "b", "c"], [0.37, 1.02, 2.66])
    # Means of the two frames' times; the last frame fills the last patch, as the processor pads.
    assert groups == [("<0.7 seconds>", ["a", "b"]), ("<2.7 seconds>", ["c", "c"])]
    assert frame_groups(["still"], [4.2]) == [("<4.2 seconds>", ["still", "still"])]
    # Frame times are whole milliseconds to the engine (engine_io.TIMEBASE_HZ) before the mean.
    assert frame_groups(["a", "b"], [0.04949, 0.15]) == [("<0.1 seconds>", ["a", "b"])]
    with pytest.raises(ValueError, match="2 frames but 1 timestamps"):
        frame_groups(["a", "b"], [0.0])


def test_the_user_turn_holds_the_outer_markers_each_patch_time_and_the_prompt():
    messages = [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "<video>List the finds."},
                {"role": "assistant", "content": "{}"}]
    example = row(messages, ["a", "b", "c"], [0.0, 0.5, 1.0], 2)
    assert example["messages"][1]["content"] == \
        "<|vision_start|><0.2 seconds><video><1.0 seconds><video><|vision_end|>List the finds."
    assert example["messages"][0] == messages[0] and example["messages"][2] == messages[2]
    assert example["videos"] == [["a", "b"], ["c", "c"]] and messages[1]["content"] == "<video>List the finds."


def test_videos_a_two_frame_split_would_size_otherwise_are_refused_with_the_reason():
    geometry = VideoGeometry.of_model(tiny_model() / "base")
    assert geometry is not None and geometry.temporal == 2
    assert geometry.refusal(3, {(64, 64)}) is None
    # 3 frames of 32x32 fill the processor's minimum together; 2 alone are scaled up.
    assert "sizes these frames for all 3" in geometry.refusal(3, {(32, 32)})
    assert "more than one size" in geometry.refusal(2, {(64, 64), (64, 32)})
    assert "under 28 px" in geometry.refusal(2, {(640, 20)})
    assert VideoGeometry.of_model(tiny_model() / "no-such-model") is None


def test_the_recipe_continues_a_plain_lora_of_the_served_model_and_says_why_it_cannot_otherwise(tmp_path):
    from demo_model import ADAPTERS, BASE
    from vidlora.feedback.llamafactory import continuable

    served = ADAPTERS / "tomb_structure"
    config = json.loads((served / "adapter_config.json").read_text())
    keys, why = continuable(served, str(BASE))
    assert why is None and keys == {"adapter_name_or_path": str(served.resolve()), "lora_rank": config["r"],
                                    "lora_alpha": config["lora_alpha"],
                                    "lora_target": ",".join(sorted(config["target_modules"]))}

    def variant(name: str, **change) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "adapter_config.json").write_text(json.dumps({**config, **change}))
        return folder

    assert "uses DoRA" in continuable(variant("dora", use_dora=True), str(BASE))[1]
    assert "trained on /models/other-vl" in continuable(variant("other", base_model_name_or_path="/models/other-vl"),
                                                        str(BASE))[1]
    assert "not a LoRA" in continuable(variant("ia3", peft_type="IA3"), str(BASE))[1]
    assert "cannot be read" in continuable(tmp_path / "missing", str(BASE))[1]
    assert continuable(None, str(BASE)) == (None, "the scenario serves no adapter")


def write_frames(result_id: int, timestamps: list[float], sizes: list[tuple[int, int]]) -> None:
    """Noise JPEGs in the media store as the result's frame set (noise: a resize would show)."""
    from vidlora.config import get_settings
    from vidlora.db import session_scope
    from vidlora.models import Result

    rng = np.random.default_rng(result_id)
    root = Path(get_settings().media_root)
    files = []
    for i, (w, h) in enumerate(sizes):
        rel = f"frames/lf{result_id}/{i:04d}.jpg"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
        (root / rel).write_bytes(buf.getvalue())
        files.append(rel)
    with session_scope() as session:
        frame_set = session.get(Result, result_id).analysis.frame_set
        frame_set.files, frame_set.timestamps = files, timestamps


def approve(result_ids: list[int]) -> None:
    from vidlora.db import session_scope
    from vidlora.models import Result
    from web.review.actions import apply_review

    for rid in result_ids:
        with session_scope() as session:
            result = session.get(Result, rid)
            apply_review(session, result, "approve", None, version=result.review_version)


def test_where_the_models_settings_cannot_be_read_the_export_says_so_and_writes_no_llamafactory_form(
        database, tmp_path):
    seeded = seed_structured([BRONZE])
    write_frames(seeded.result_ids[0], [0.0, 1.0], [(64, 64)] * 2)
    approve(seeded.result_ids)
    export = tmp_path / "export"
    out = vidlora("export-training", seeded.scenario, "--out", str(export), "--model", str(tmp_path / "elsewhere"))
    assert out.returncode == 0 and "1 example(s)" in out.stdout, out.stderr
    assert "LLaMA-Factory form not written" in out.stderr and "name its folder with --model" in out.stderr
    assert (export / "train.jsonl").exists() and not (export / "llamafactory.jsonl").exists()
    assert not (export / "dataset_info.json").exists()  # nothing for LLaMA-Factory to read into other tokens
    assert json.loads((export / "manifest.json").read_text())["llamafactory"]["file"] is None


def engine_requests(result_ids: list[int]) -> list:
    """The GPU worker's requests for these results' analyses (tasks.analysis_rows.build_request)."""
    from tasks.analysis_rows import build_request
    from vidlora.config import get_settings
    from vidlora.db import session_scope
    from vidlora.models import Result

    with session_scope() as session:
        out = []
        for rid in result_ids:
            analysis = session.get(Result, rid).analysis
            out.append(build_request(analysis.id, analysis.scenario, analysis.frame_set,
                                     Path(get_settings().media_root)))
        return out


def engine_prompt_ids(model: Path, requests: list, out: Path) -> list[list[int]]:
    env = dict(os.environ, PYTHONPATH=str(REPO), VLLM_ENABLE_V1_MULTIPROCESSING="0")
    proc = subprocess.run([sys.executable, "-m", "tests.support.engine_prompts", str(model), str(out)], cwd=REPO, env=env,
                          input=json.dumps([asdict(r) for r in requests]), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def llamafactory_load(out: Path, recipe: Path, *overrides: str) -> list[dict]:
    out.mkdir(parents=True)
    proc = subprocess.run([str(LF_PYTHON), str(REPO / "tests" / "support" / "llamafactory_load.py"), str(out),
                           str(recipe), "bf16=false", f"output_dir={out / 'adapter'}", *overrides],
                          cwd=out, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "examples.json").read_text())


@pytest.mark.engine
def test_llamafactory_reads_an_export_into_exactly_the_engines_prompt_and_frames(database, tmp_path, monkeypatch):
    assert LF_PYTHON.exists(), "scripts/install-llamafactory.sh (run by scripts/test.sh) makes LLaMA-Factory's venv"
    from vidlora.db import session_scope
    from vidlora.models import Scenario

    seeded = seed_structured([BRONZE] * 6)
    with session_scope() as session:
        session.query(Scenario).filter_by(name=seeded.scenario).one().system_prompt = SYSTEM
    odd, still, even, tiny, mixed, gold = seeded.result_ids
    write_frames(odd, [0.37, 1.02, 2.66], [(64, 64)] * 3)  # off a regular grid, an odd count
    write_frames(still, [4.2], [(64, 96)])  # one frame: a patch of itself
    write_frames(even, [0.0, 0.5, 1.0, 1.5], [(96, 64)] * 4)
    write_frames(tiny, [0.0, 1.0, 2.0], [(32, 32)] * 3)  # a 2-frame split would be scaled up
    write_frames(mixed, [0.0, 1.0], [(64, 64), (96, 64)])  # the engine resizes to the first
    write_frames(gold, [0.5, 1.5], [(64, 64)] * 2)  # held out: the trained adapter's exam
    approve(seeded.result_ids)
    assert vidlora("gold", "add", str(gold)).returncode == 0

    export = tmp_path / "export"
    out = vidlora("export-training", seeded.scenario, "--out", str(export))
    assert out.returncode == 0, out.stderr
    assert "LLaMA-Factory 0.9.5: 3 example(s) in llamafactory.jsonl; left out: 1 " in out.stdout, out.stdout
    assert "more than one size" in out.stdout and f"llamafactory-cli train {export / 'llamafactory.yaml'}" in out.stdout
    manifest = json.loads((export / "manifest.json").read_text())
    assert manifest["llamafactory"]["examples"] == 3 and sum(manifest["llamafactory"]["skipped"].values()) == 2

    factory = llamafactory_load(tmp_path / "lf", export / "llamafactory.yaml")
    requests = engine_requests([odd, still, even])
    engine = engine_prompt_ids(tiny_model() / "base", requests, tmp_path / "engine.json")
    assert len(factory) == 3
    from transformers import AutoTokenizer

    from engine_patch.verify.video import check_same_input, reference_inputs

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model() / "base"))
    answer = json.loads((export / "train.jsonl").read_text().splitlines()[0])["messages"][-1]["content"]
    for ex, vllm_ids, req in zip(factory, engine, requests):
        check_same_input(ex["prompt_ids"], vllm_ids, tokenizer.decode)  # raises naming the first difference
        assert ex["response_ids"] == tokenizer.encode(answer + "<|im_end|>\n", add_special_tokens=False)
        # The frames: LLaMA-Factory's patches are the engine processor's, patch for patch.
        _, enc = reference_inputs(tiny_model() / "base", req)
        (t, h, w), = enc["video_grid_thw"].tolist()
        assert ex["video_grid_thw"] == [[1, h, w]] * t
        np.testing.assert_allclose(np.load(tmp_path / "lf" / f"{factory.index(ex)}.npy"),
                                   enc["pixel_values_videos"].float().numpy(), atol=1e-6)

    # The recipe before this form: the same export's train.jsonl under LLaMA-Factory's own
    # Qwen3.5 template. Its frame times and markers are not the engine's.
    before = tmp_path / "before"
    before.mkdir()
    info = json.loads((export / "dataset_info.json").read_text())
    info[manifest["dataset_name"]]["file_name"] = "train.jsonl"
    (before / "train.jsonl").write_text((export / "train.jsonl").read_text().splitlines()[0] + "\n")  # the odd one
    (before / "dataset_info.json").write_text(json.dumps(info))
    old = llamafactory_load(tmp_path / "lf-before", export / "llamafactory.yaml", "template=qwen3_5",
                            f"dataset_dir={before}", f"media_dir={export}")
    old_text = tokenizer.decode(old[0]["prompt_ids"])
    assert old[0]["prompt_ids"] != engine[0] and "<0.7 seconds>" not in old_text
    assert "<0.7 seconds>" in tokenizer.decode(engine[0])

    # The recipe's command as docs/feedback-loop.md gives it (2 steps on the CPU), on the demo
    # model (trained weights, where a fresh LoRA trained a few steps changes the answers too
    # little for the engine's guard: issue 61), for the scenario serving the demo tomb adapter:
    # the recipe continues that adapter, the new version moves, serves (its gold run through the
    # engine host answers) and promote takes it.
    continued_recipe_serves(seeded.scenario, tmp_path, monkeypatch)


def continued_recipe_serves(scenario: str, tmp_path: Path, monkeypatch) -> None:
    import shutil

    import yaml
    from safetensors.torch import load_file

    from demo_model import ADAPTERS, BASE
    from vidlora.db import session_scope
    from vidlora.models import AdapterRelease, Scenario
    from vidlora.scenarios import adapter_version

    served = tmp_path / "served"
    shutil.copytree(ADAPTERS / "tomb_structure", served)
    with session_scope() as session:
        row = session.query(Scenario).filter_by(name=scenario).one()
        row.adapter_path, row.adapter_version = str(served), adapter_version(str(served))
    export = tmp_path / "export-demo"
    out = vidlora("export-training", scenario, "--out", str(export), "--model", str(BASE))
    assert out.returncode == 0, out.stderr
    assert f"the recipe continues the serving adapter {served.resolve()}" in out.stdout, out.stdout
    recipe = yaml.safe_load((export / "llamafactory.yaml").read_text())
    config = json.loads((served / "adapter_config.json").read_text())
    assert (recipe["adapter_name_or_path"], recipe["lora_rank"], recipe["lora_target"]) == \
        (str(served.resolve()), config["r"], ",".join(sorted(config["target_modules"])))
    assert "add bf16=false" in (export / "llamafactory.yaml").read_text()

    trained = tmp_path / "trained"
    proc = subprocess.run([str(LF_PYTHON.parent / "llamafactory-cli"), "train", str(export / "llamafactory.yaml"),
                           "bf16=false", f"output_dir={trained}", "max_steps=2", "preprocessing_num_workers=1"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((trained / "adapter_config.json").read_text())["r"] == config["r"]
    before, after = load_file(served / "adapter_model.safetensors"), load_file(trained / "adapter_model.safetensors")
    # The same modules (LLaMA-Factory names them as PEFT does), each moved from where it was.
    assert set(after) == set(before)
    moved = max(float((after[k].float() - before[k].float()).norm() / before[k].float().norm().clamp_min(1e-12))
                for k in before if "lora_B" in k)
    print(f"continued adapter: largest relative change of a lora_B after 2 steps: {moved:.3g}")
    assert moved > 1e-3, moved

    monkeypatch.setenv("VIDLORA_MODEL", str(BASE))
    out = vidlora("scenarios", "register", scenario, str(trained), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "answered 1 of 1 gold video" in out.stdout + out.stderr and "refuse" not in out.stderr, out.stderr[-3000:]
    version = out.stdout.split("adapter version ")[1].split()[0]
    with session_scope() as session:
        [release] = session.query(AdapterRelease).filter(AdapterRelease.path == str(trained.resolve())).all()
        [answer] = release.gold_answers.values()
    assert answer["error"] is None and answer["schema_ok"] is True, answer
    out = vidlora("scenarios", "promote", scenario, version[:12])
    assert out.returncode == 0 and "now serving" in out.stdout, out.stderr
