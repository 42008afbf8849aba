"""What the demo model trains on is what the GPU worker gives it: the same frames (up to the
codec), the same timestamps, the same prompt tokens, for every shipped scenario."""

from __future__ import annotations

import pytest

from demo_model import BASE
from demo_model.data import Encoder, ScenarioText, answer_text, sampled_frames
from vidlora import scenes
from vidlora.config import PROJECT_ROOT

pytestmark = pytest.mark.skipif(not (BASE / "config.json").is_file(), reason="demo model weights not built")


@pytest.fixture(scope="module")
def encoder():
    return Encoder(BASE, ScenarioText.load(PROJECT_ROOT / "scenarios.yaml"))


@pytest.mark.parametrize("scenario", sorted(scenes.KIND_OF))
def test_training_inputs_equal_the_pipelines_for_the_same_scene(scenario, encoder, tmp_path):
    from engine_patch.verify.video import reference_inputs
    from vidlora.engine_io import AnalysisRequest
    from vidlora.media.frames import sample_video
    from vidlora.media.sampling import SamplingPolicy

    spec = encoder.scenarios[scenario]
    scene = scenes.random_scene(scenes.KIND_OF[scenario], scenes.FRESH_SEEDS + 7)
    [(video, _)] = scenes.generate(scene.kind, [scene.seed], tmp_path)
    sampled = sample_video(video, SamplingPolicy.from_dict(spec.sampling), tmp_path / "frames")
    req = AnalysisRequest(request_key="x", prompt=spec.prompt, system=spec.system,
                          frames=[str(p) for p in sampled.paths(tmp_path)], timestamps=list(sampled.timestamps),
                          adapter_name=None, adapter_path=None, max_tokens=1, temperature=0.0, top_p=1.0, seed=0)
    _, pipeline = reference_inputs(BASE, req)

    frames, timestamps = sampled_frames(scene, spec.sampling)
    assert timestamps == list(sampled.timestamps)
    ours = encoder.prompt_inputs(scenario, frames, timestamps)
    assert ours["input_ids"].tolist() == pipeline["input_ids"].tolist()
    assert ours["video_grid_thw"].tolist() == pipeline["video_grid_thw"].tolist()
    # H.264 at CRF 18 then JPEG, against JPEG alone: the same picture to within a few levels.
    diff = (ours["pixel_values_videos"] - pipeline["pixel_values_videos"]).abs()
    assert float(diff.mean()) < 0.03, float(diff.mean())  # values span [-1, 1]


def test_labels_cover_the_answer_and_its_end_only(encoder):
    scene = scenes.random_scene("tomb", 3)
    ex = encoder.example("tomb_structure", scene, scenes.expected_answer(scene))
    labelled = ex["labels"] != -100
    n = int(labelled.sum())
    assert bool(labelled[-n:].all()) and not bool(labelled[:-n].any())  # the tail, and only it
    assert encoder.tokenizer.decode(ex["input_ids"][-n:].tolist()) == \
        answer_text(scenes.expected_answer(scene)) + "<|im_end|>"
    prompt = encoder.prompt_inputs("tomb_structure", *sampled_frames(scene, encoder.scenarios["tomb_structure"].sampling))
    assert ex["input_ids"][:-n].tolist() == prompt["input_ids"][0].tolist()
