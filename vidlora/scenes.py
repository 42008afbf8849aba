"""Generated archaeology scenes whose contents are known: what a model that sees is trained on,
what the demo can show beside the truth, and what accuracy is measured against (issue 16).

Three kinds, one per shipped scenario, each a short video drawn from a seed:

- ``artifact``: one object moving across a plain ground. Its outline is the object type
  (vessel: disc, coin: small square, weapon: long blade, figurine: triangle), its colour the
  material (bronze, jade, gold, ceramic), its marking the period (stripes: han, dots: tang,
  cross: zhou, none: unknown).
- ``tomb``: a plan of 1-4 chambers (rectangles) joined in a row by corridors, seen as the
  camera pans across it. The truth is the chamber count; passages are count - 1.
- ``mural``: a wall with a short inscription of 3 glyphs from a 6-glyph script, painted large
  and far apart, so the camera holds on one glyph at a time: on glyph k for the k-th quarter
  of the clip, on the bare wall past the inscription for the last. The truth is the
  transcription, read in time order.

The same seed gives the same frames, byte for byte (numpy only, no fonts or codecs involved
until ``write_video``). ``expected_answer`` is the truth in the scenario's output schema, so
an answer can be compared with it field by field (``correct``).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

KINDS = ("artifact", "tomb", "mural")
SCENARIO_OF = {"artifact": "artifact_identification", "tomb": "tomb_structure", "mural": "murals_inscriptions"}
KIND_OF = {scenario: kind for kind, scenario in SCENARIO_OF.items()}

SHAPES = ("vessel", "coin", "weapon", "figurine")
MATERIALS = {"bronze": (150, 96, 38), "jade": (58, 158, 96), "gold": (232, 192, 40), "ceramic": (196, 88, 58)}
MARKINGS = {"han": "stripes", "tang": "dots", "zhou": "cross", "unknown": "plain"}
GROUND = (214, 200, 170)  # sand
WALL = (226, 214, 190)  # plaster
INK = (40, 30, 24)

# A 6-glyph script, 5x5 bitmaps: distinct at a glance, none a rotation of another.
GLYPHS = {
    "A": ["..#..", ".#.#.", "#####", "#...#", "#...#"],
    "E": ["#####", "#....", "####.", "#....", "#####"],
    "H": ["#...#", "#...#", "#####", "#...#", "#...#"],
    "O": [".###.", "#...#", "#...#", "#...#", ".###."],
    "T": ["#####", "..#..", "..#..", "..#..", "..#.."],
    "X": ["#...#", ".#.#.", "..#..", ".#.#.", "#...#"],
}
INSCRIPTION_LENGTH = 3
# The demo model trains on scenes of seeds below this; the demo and the accuracy tests draw
# theirs at or above it, so what they show is never a training example.
FRESH_SEEDS = 10**9


@dataclass(frozen=True)
class Scene:
    kind: str
    seed: int
    object_type: str | None = None
    material: str | None = None
    period: str | None = None
    chamber_count: int | None = None
    transcription: str | None = None

    @property
    def scenario(self) -> str:
        return SCENARIO_OF[self.kind]


def random_scene(kind: str, seed: int) -> Scene:
    """A scene of ``kind`` drawn from ``seed`` (uniform over its classes)."""
    if kind not in KINDS:
        raise ValueError(f"unknown scene kind {kind!r}; known: {', '.join(KINDS)}")
    rng = np.random.default_rng([KINDS.index(kind), seed])
    if kind == "artifact":
        return Scene(kind, seed, object_type=str(rng.choice(SHAPES)), material=str(rng.choice(list(MATERIALS))),
                     period=str(rng.choice(list(MARKINGS))))
    if kind == "tomb":
        return Scene(kind, seed, chamber_count=int(rng.integers(1, 5)))
    return Scene(kind, seed, transcription="".join(rng.choice(list(GLYPHS), INSCRIPTION_LENGTH)))


@dataclass(frozen=True)
class Hardness:
    """Scenes harder than the demo model was trained on, for measuring what it does when it
    errs (bench/review_priority.py): heavier sensor noise, a static occluder in front of the
    camera (a pillar, a survey board) hiding part of the view, and tombs of more chambers."""

    noise: int = 6  # amplitude of the sensor noise (what training saw: 6)
    occlusion: float = 0.0  # side of the occluding square, as a share of the frame (0: none)
    max_chambers: int = 4  # tombs draw 1..max_chambers chambers (training: 4)


def hard_scene(kind: str, seed: int, hardness: Hardness) -> Scene:
    """``random_scene``, with tombs of up to ``hardness.max_chambers`` chambers."""
    scene = random_scene(kind, seed)
    if kind == "tomb" and hardness.max_chambers != 4:
        rng = np.random.default_rng([KINDS.index(kind), seed, 5])
        scene = Scene(kind, seed, chamber_count=int(rng.integers(1, hardness.max_chambers + 1)))
    return scene


def render(scene: Scene, frames: int = 8, size: int = 224, hardness: Hardness | None = None) -> np.ndarray:
    """The scene as ``frames`` RGB frames of ``size`` x ``size``: uint8 [T, H, W, 3]."""
    hard = hardness or Hardness()
    draw = {"artifact": _artifact, "tomb": _tomb, "mural": _mural}[scene.kind]
    out = np.stack([draw(scene, t / max(frames - 1, 1), size) for t in range(frames)])
    if hard.occlusion > 0:
        rng = np.random.default_rng([KINDS.index(scene.kind), scene.seed, 4])
        side = int(round(hard.occlusion * size))
        x, y = (int(v) for v in rng.integers(0, size - side + 1, 2))
        out[:, y:y + side, x:x + side] = rng.integers(40, 200, 3)
    # A little sensor noise, so no two scenes share a frame and codecs see texture.
    noise = np.random.default_rng([KINDS.index(scene.kind), scene.seed, 2]).integers(-hard.noise, hard.noise + 1,
                                                                                     out.shape)
    return np.clip(out.astype(np.int16) + noise, 0, 255).astype(np.uint8)


def write_video(frames: np.ndarray, path: Path, fps: int = 4) -> Path:
    """Encode frames as H.264 MP4 (yuv420p), written whole or not at all."""
    # Imported here: rendering needs numpy alone (training hosts need not carry vidlora's settings).
    from vidlora.media.ffprobe import FFMPEG

    t, h, w, _ = frames.shape
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.part.mp4")
    subprocess.run([FFMPEG, "-v", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{w}x{h}",
                    "-r", str(fps), "-i", "-", "-c:v", "libx264", "-preset", "veryfast", "-crf", "18",
                    "-pix_fmt", "yuv420p", str(tmp)], input=frames.tobytes(), check=True, timeout=120)
    tmp.rename(path)
    return path


def generate(kind: str, seeds: list[int], out_dir: Path, frames: int = 8, size: int = 224) -> list[tuple[Path, Scene]]:
    """Videos of ``kind`` for ``seeds`` in ``out_dir`` (kept if already there), with their truth."""
    made = []
    for seed in seeds:
        scene = random_scene(kind, seed)
        path = out_dir / f"{kind}-{seed:05d}.mp4"
        if not path.exists():
            write_video(render(scene, frames, size), path)
        made.append((path, scene))
    return made


def expected_answer(scene: Scene) -> dict:
    """The truth in the scenario's output schema (scenarios.yaml)."""
    if scene.kind == "artifact":
        return {"finds": [{"object_type": scene.object_type, "material": scene.material,
                           "decoration": MARKINGS[scene.period], "condition": "intact",
                           "period": scene.period, "confidence": 0.9}]}
    if scene.kind == "tomb":
        n = scene.chamber_count
        return {"chamber_count": n,
                "chambers": [{"name": f"chamber {i + 1}", "shape": "rectangular", "material": "brick",
                              "length_m": 4, "width_m": 3} for i in range(min(n, 4))],
                "passages": n - 1, "construction": "vaulted_brick", "damage": ["none"]}
    return {"scenes": [], "inscriptions": [{"script": "seal", "language": "unknown",
                                            "transcription": scene.transcription, "legibility": "clear"}]}


def correct(scene: Scene, answer: dict | None) -> bool:
    """Whether an answer gets what the scene shows: the artifact's type, material and period;
    the tomb's chamber count; the inscription's transcription."""
    if not isinstance(answer, dict):
        return False
    try:
        if scene.kind == "artifact":
            find = answer["finds"][0]
            return (find["object_type"], find["material"], find["period"]) == (
                scene.object_type, scene.material, scene.period)
        if scene.kind == "tomb":
            return answer["chamber_count"] == scene.chamber_count
        return answer["inscriptions"][0]["transcription"].strip().upper() == scene.transcription
    except (KeyError, IndexError, TypeError, AttributeError):
        return False


def truth_text(scene: Scene) -> str:
    """What the scene shows, in the few words ``answer_text`` uses for an answer."""
    if scene.kind == "artifact":
        return f"{scene.object_type} {scene.material} {scene.period}"
    if scene.kind == "tomb":
        return f"{scene.chamber_count} chamber" + ("s" if scene.chamber_count != 1 else "")
    return scene.transcription or ""


def answer_text(kind: str, answer: dict | None) -> str:
    """The fields of an answer that ``correct`` scores, in the same few words ("-" if absent)."""
    try:
        if kind == "artifact":
            find = answer["finds"][0]
            return f"{find['object_type']} {find['material']} {find['period']}"
        if kind == "tomb":
            n = answer["chamber_count"]
            return f"{n} chamber" + ("s" if n != 1 else "")
        return str(answer["inscriptions"][0]["transcription"])
    except (KeyError, IndexError, TypeError):
        return "-"


# -- drawing --------------------------------------------------------------------------------


def _canvas(size: int, colour) -> np.ndarray:
    return np.broadcast_to(np.array(colour, np.uint8), (size, size, 3)).copy()


def _artifact(scene: Scene, t: float, size: int) -> np.ndarray:
    img = _canvas(size, GROUND)
    yy, xx = np.mgrid[0:size, 0:size]
    # The object drifts across the view along a line drawn once per scene.
    path = np.random.default_rng([0, scene.seed, 3]).uniform(0.3, 0.7, 4)
    cx = size * (path[0] + (path[1] - path[0]) * t)
    cy = size * (path[2] + (path[3] - path[2]) * t)
    r = size * 0.2
    dx, dy = xx - cx, yy - cy
    shape = {
        "vessel": dx ** 2 + dy ** 2 <= r ** 2,
        "coin": (abs(dx) <= r * 0.6) & (abs(dy) <= r * 0.6),
        "weapon": (abs(dx) <= r * 1.4) & (abs(dy) <= r * 0.28),
        "figurine": (dy <= r * 0.8) & (dy >= -r) & (abs(dx) <= (dy + r) * 0.55),
    }[scene.object_type]
    img[shape] = MATERIALS[scene.material]
    pattern = MARKINGS[scene.period]
    if pattern == "stripes":
        mark = shape & ((np.floor((yy - cy) / (r * 0.25)) % 2) == 0) & (abs(dy) < r * 0.9)
    elif pattern == "dots":
        gx, gy = (dx / (r * 0.5)) % 1, (dy / (r * 0.5)) % 1
        mark = shape & ((gx - 0.5) ** 2 + (gy - 0.5) ** 2 < 0.06)
    elif pattern == "cross":
        mark = shape & ((abs(dx) < r * 0.12) | (abs(dy) < r * 0.12))
    else:
        mark = np.zeros_like(shape)
    img[mark] = INK
    return img


def _tomb(scene: Scene, t: float, size: int) -> np.ndarray:
    img = _canvas(size, (120, 104, 86))  # earth
    n = scene.chamber_count
    # Chambers in a row, centred, with a slow pan: all in view in every frame (more than the
    # 4 of training are drawn narrower, to fit).
    room_w, gap = size * 0.16, size * 0.07
    if n > 4:
        scale = 0.85 * size / (n * room_w + (n - 1) * gap)
        room_w, gap = room_w * scale, gap * scale
    total = n * room_w + (n - 1) * gap
    pan = (t - 0.5) * size * 0.08
    x0 = (size - total) / 2 + pan
    top, bottom = size * 0.36, size * 0.64
    yy, xx = np.mgrid[0:size, 0:size]
    for i in range(n):
        left = x0 + i * (room_w + gap)
        room = (xx >= left) & (xx < left + room_w) & (yy >= top) & (yy < bottom)
        img[room] = (200, 160, 110)  # brick floor
        edge = room & ((xx < left + 2) | (xx >= left + room_w - 2) | (yy < top + 2) | (yy >= bottom - 2))
        img[edge] = INK
        if i < n - 1:
            corridor = (xx >= left + room_w) & (xx < left + room_w + gap) & (abs(yy - size / 2) < size * 0.03)
            img[corridor] = (170, 140, 100)
    return img


def glyph_cell(size: int) -> int:
    """Pixels per bitmap cell of a painted glyph in a frame ``size`` wide."""
    return size // 12


def mural_hold(t: float) -> int:
    """Which glyph the camera holds on at ``t`` (0 to 1 over the clip): glyph k in the k-th
    quarter, none (the bare wall, ``INSCRIPTION_LENGTH``) in the last. A video model sees each
    quarter as its own block of frames, so glyph k is read from the k-th block."""
    return min(int(t * 4 + 1e-9), INSCRIPTION_LENGTH)


def _mural(scene: Scene, t: float, size: int) -> np.ndarray:
    img = _canvas(size, WALL)
    k = mural_hold(t)
    if k >= INSCRIPTION_LENGTH:
        return img
    px = glyph_cell(size)
    glyph = 5 * px
    sway = int(round(np.sin(7 * t + scene.seed) * px / 2))  # the hand-held camera
    x0, y0 = (size - glyph) // 2 + sway, (size - glyph) // 2
    for r, row in enumerate(GLYPHS[scene.transcription[k]]):
        for c, on in enumerate(row):
            if on == "#":
                img[y0 + r * px:y0 + (r + 1) * px, x0 + c * px:x0 + (c + 1) * px] = (150, 40, 30)  # red ochre
    return img
