"""The shipped demo weights: within the repo's 5 MB, and still what ``demo_model.train`` makes
(the short rerun CI can afford, against the fingerprint recorded when they were made)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from demo_model import WEIGHTS
from tests.support.env import ROOT


def test_shipped_weights_fit_in_five_megabytes_and_are_the_recorded_files():
    record = json.loads((WEIGHTS / "TRAINING.json").read_text())
    files = sorted(p for p in WEIGHTS.rglob("*") if p.is_file() and p.name != "TRAINING.json")
    assert [str(p.relative_to(WEIGHTS)) for p in files] == sorted(record["files"])
    assert sum(p.stat().st_size for p in files) < 5 * 10**6
    # Each scenario's adapter, and the generic answer without one, learnt on unseen scenes.
    assert set(record["accuracy"]) == {f"{s}/{m}" for s in ("artifact_identification", "tomb_structure",
                                                            "murals_inscriptions") for m in ("adapter", "base")}


def test_the_training_script_still_makes_the_shipped_weights():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "demo_model.train", "--check"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["files_ok"], result


def test_one_mixed_pass_trains_each_group_as_its_own_adapter_would(tmp_path):
    """A step runs every group in one pass, row by row with its own adapter (or none). Its loss
    and gradients must be those of each group run alone with that adapter active."""
    import torch

    from demo_model import train
    from demo_model.data import ScenarioText

    scenarios = {k: v for k, v in ScenarioText.load(train.SCENARIOS_FILE).items() if k in train.KIND_OF}
    tok, config = train.write_base_files(tmp_path / "base", scenarios)
    model = train.build_model(config, sorted(scenarios))
    for name, p in model.named_parameters():  # LoRA B starts at zero: give every adapter a delta
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05)
    train._all_trainable(model)
    stream = train.Stream(tmp_path / "base", scenarios)
    batch, names = train._step_batches(tok.pad_token_id)([stream[i] for i in range(2 * train.PER_GROUP * 4)][::4])
    assert len(set(names)) == 4 and train.BASE_ONLY in names

    loss, per_group = train.step_loss(model, names, batch, "cpu")
    loss.backward()
    mixed = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)

    for name in dict.fromkeys(names):
        rows = [i for i, n in enumerate(names) if n == name]
        sub = {k: v[rows] for k, v in batch.items() if k not in ("pixel_values_videos", "video_grid_thw")}
        ends = batch["video_grid_thw"].prod(1).cumsum(0).tolist()
        sub["pixel_values_videos"] = torch.cat([batch["pixel_values_videos"][(ends[i - 1] if i else 0):ends[i]]
                                                for i in rows])
        sub["video_grid_thw"] = batch["video_grid_thw"][rows]
        if name == train.BASE_ONLY:
            with model.disable_adapter():
                out = model(**sub)
        else:
            model.set_adapter(name)
            train._all_trainable(model)
            out = model(**sub)
        assert abs(float(out.loss.detach()) - per_group[name]) < 1e-4 * max(1.0, per_group[name])
        # Backward before the next set_adapter: it turns the other adapters' gradients off.
        (out.loss / len(per_group)).backward()
    assert set(mixed) == {n for n, p in model.named_parameters() if p.grad is not None}
    for n, g in mixed.items():
        torch.testing.assert_close(g, model.get_parameter(n).grad, rtol=1e-3, atol=1e-6, msg=n)
