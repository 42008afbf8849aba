"""vidlora.scenes: generated scenes carry their truth in the pixels (simple readers recover it
from the frames alone), are the same for the same seed, and their expected answers are valid
answers of the shipped scenarios' schemas."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from tests.support.env import ROOT
from vidlora import scenes
from vidlora.scenarios import load_scenarios

SEEDS = range(60)


def test_same_seed_same_frames_and_seeds_differ():
    for kind in scenes.KINDS:
        a, b = scenes.render(scenes.random_scene(kind, 5)), scenes.render(scenes.random_scene(kind, 5))
        assert a.tobytes() == b.tobytes()
        assert a.tobytes() != scenes.render(scenes.random_scene(kind, 6)).tobytes()


def test_every_class_is_drawn():
    artifacts = [scenes.random_scene("artifact", s) for s in SEEDS]
    assert {a.object_type for a in artifacts} == set(scenes.SHAPES)
    assert {a.material for a in artifacts} == set(scenes.MATERIALS)
    assert {a.period for a in artifacts} == set(scenes.MARKINGS)
    assert {scenes.random_scene("tomb", s).chamber_count for s in SEEDS} == {1, 2, 3, 4}
    letters = Counter("".join(scenes.random_scene("mural", s).transcription for s in SEEDS))
    assert set(letters) == set(scenes.GLYPHS)


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown scene kind"):
        scenes.random_scene("pyramid", 1)


@pytest.mark.parametrize("seed", list(SEEDS)[:24])
def test_the_frames_show_the_truth(seed):
    artifact = scenes.random_scene("artifact", seed)
    assert _read_material(scenes.render(artifact)) == artifact.material
    tomb = scenes.random_scene("tomb", seed)
    assert _count_chambers(scenes.render(tomb)) == tomb.chamber_count
    mural = scenes.random_scene("mural", seed)
    assert _read_glyphs(scenes.render(mural)) == mural.transcription


def test_expected_answers_fit_the_shipped_schemas_and_score_right():
    specs = {s.name: s for s in load_scenarios(ROOT / "scenarios.yaml", ROOT / "var" / "no-adapters")}
    for kind in scenes.KINDS:
        for seed in range(8):
            scene = scenes.random_scene(kind, seed)
            answer = scenes.expected_answer(scene)
            jsonschema.validate(answer, specs[scene.scenario].output_schema)
            assert scenes.correct(scene, answer)
            assert not scenes.correct(scene, None) and not scenes.correct(scene, {})
    wrong = scenes.expected_answer(scenes.random_scene("tomb", 1))
    wrong["chamber_count"] += 1
    assert not scenes.correct(scenes.random_scene("tomb", 1), wrong)


def test_the_truth_survives_encoding_and_the_scenarios_own_sampling(tmp_path: Path):
    """Through what a worker does: H.264 video, then the scenario's sampling policy decoded to
    JPEG frames by vidlora.media; the readers still recover every truth."""
    from PIL import Image

    from vidlora.media.frames import sample_video
    from vidlora.media.sampling import SamplingPolicy

    specs = {s.name: s for s in load_scenarios(ROOT / "scenarios.yaml", ROOT / "var" / "no-adapters")}
    readers = {"artifact": lambda f, sc: _read_material(f) == sc.material,
               "tomb": lambda f, sc: _count_chambers(f) == sc.chamber_count,
               "mural": lambda f, sc: _read_glyphs(f) == sc.transcription}
    for kind in scenes.KINDS:
        for path, scene in scenes.generate(kind, [11, 12, 13], tmp_path / "videos"):
            policy = SamplingPolicy.from_dict(specs[scene.scenario].sampling)
            sampled = sample_video(path, policy, tmp_path / "frames" / path.stem)
            frames = np.stack([np.asarray(Image.open(f).convert("RGB")) for f in sampled.paths(tmp_path / "frames")])
            assert frames.shape[1:] == (224, 224, 3) and len(frames) >= 4, (path, frames.shape)
            assert readers[kind](frames, scene), (scene, sampled.backend)
    # Generated once: a second call keeps the files.
    before = (tmp_path / "videos" / "mural-00011.mp4").stat().st_mtime_ns
    scenes.generate("mural", [11], tmp_path / "videos")
    assert (tmp_path / "videos" / "mural-00011.mp4").stat().st_mtime_ns == before


# -- readers that know nothing but the drawing conventions ---------------------------------------


def _read_material(frames: np.ndarray) -> str:
    """The colour covering the most pixels that is neither ground nor ink."""
    px = frames[0].reshape(-1, 3).astype(int)
    names, colours = zip(*scenes.MATERIALS.items())
    d = np.abs(px[:, None, :] - np.array(colours)[None]).sum(-1)
    close = d.min(1) < 40
    return names[Counter(d.argmin(1)[close]).most_common(1)[0][0]]


def _count_chambers(frames: np.ndarray) -> int:
    """Runs of brick floor along the middle row, above the corridor line."""
    row = frames[0, frames.shape[1] * 45 // 100].astype(int)
    floor = np.abs(row - np.array((200, 160, 110))).sum(-1) < 40
    return int(np.count_nonzero(floor[1:] & ~floor[:-1]) + floor[0])


def _read_glyphs(frames: np.ndarray) -> str:
    """The glyph held in each quarter of the clip (the middle frame of the quarter): cut out at
    the drawing's cell size and matched against each 5x5 bitmap. The last quarter is bare."""
    n = len(frames)
    held = [frames[int((k + 0.5) * n / 4)] for k in range(4)]
    text = "".join(_read_glyph(f) for f in held[:scenes.INSCRIPTION_LENGTH])
    assert not _red(held[-1]).any(), "the last quarter shows the bare wall"
    return text


def _red(frame: np.ndarray) -> np.ndarray:
    return np.abs(frame.astype(int) - np.array((150, 40, 30))).sum(-1) < 60


def _read_glyph(frame: np.ndarray) -> str:
    red = _red(frame)
    rows, cols = np.flatnonzero(red.any(1)), np.flatnonzero(red.any(0))
    px = scenes.glyph_cell(frame.shape[1])
    top, left = rows[0], cols[0]  # every glyph lights its top row and its first column
    bitmap = ["".join("#" if red[top + r * px + px // 2, left + c * px + px // 2] else "." for c in range(5))
              for r in range(5)]
    match = [g for g, bm in scenes.GLYPHS.items() if bm == bitmap]
    return match[0] if match else "?"
