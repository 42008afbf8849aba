"""`vidlora eval`, `vidlora export-training` and `vidlora gold`, run as a user runs them, on
results reviewed through the product's own review action."""

from __future__ import annotations

import io
import json
from datetime import timedelta
from pathlib import Path

import pytest
from PIL import Image

from tests.support.cli import vidlora
from tests.support.structured import seed_structured
from vidlora.config import get_settings
from vidlora.db import session_scope
from vidlora.feedback.training_set import TrainingSetError
from vidlora.models import Result, Review, utcnow

BRONZE = {"sealed": True, "finds": [{"material": "bronze", "period": "han", "confidence": 0.8}]}
JADE = {"sealed": True, "finds": [{"material": "jade", "period": "han", "confidence": 0.8}]}


def review(result_id: int, action: str, fields=None, version: str | None = None) -> None:
    from web.review.actions import apply_review

    with session_scope() as session:
        result = session.get(Result, result_id)
        if version is not None:
            result.adapter_version = version
        apply_review(session, result, action, None, fields=fields, version=result.review_version)


def with_frames(result_id: int, count: int = 3) -> list[bytes]:
    """Real JPEGs in the media store for the result's frame set, as the CPU workers leave them."""
    root = Path(get_settings().media_root)
    made = []
    with session_scope() as session:
        frame_set = session.get(Result, result_id).analysis.frame_set
        files = []
        for i in range(count):
            buf = io.BytesIO()
            Image.new("RGB", (32, 32), (40 * i, 90, result_id % 255)).save(buf, "JPEG")
            rel = f"frames/fb{result_id}/{i:04d}.jpg"
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(buf.getvalue())
            files.append(rel)
            made.append(buf.getvalue())
        frame_set.files, frame_set.timestamps = files, [0.25 + i for i in range(count)]
    return made


def test_eval_reports_each_version_with_counts_and_intervals(database):
    sure, unsure = {"sealed": 0.99, "finds": 0.95}, {"sealed": 0.99, "finds": 0.35}
    seeded = seed_structured([BRONZE] * 5, confidences=[sure, unsure, unsure, sure, None])
    ids = seeded.result_ids
    review(ids[0], "approve", version="v1-aaaa")
    review(ids[1], "edit", fields=JADE, version="v1-aaaa")
    review(ids[2], "reject", version="v1-aaaa")
    review(ids[3], "approve", version="v2-bbbb")
    review(ids[4], "approve", version="v2-bbbb")
    out = vidlora("eval", seeded.scenario, "--json")
    assert out.returncode == 0, out.stderr
    versions = {v["version"]: v for v in json.loads(out.stdout)["versions"]}
    v1, v2 = versions["v1-aaaa"], versions["v2-bbbb"]
    assert (v1["reviewed"], v1["approved"]["count"], v1["edited"]["count"], v1["rejected"]["count"]) == (3, 1, 1, 1)
    assert v2["approved"]["rate"] == 1.0 and v2["approved"]["ci95"][0] < 1.0  # 2 of 2: a wide interval
    material = next(f for f in v1["fields"] if f["field"] == "finds.material")
    assert (material["right"], material["of"]) == (1, 2)  # the edit changed it; the rejection is not compared
    # Calibration (issue 51): v1's sure answer was approved, its two unsure ones edited and rejected.
    calibration = {c["version"]: c for c in json.loads(out.stdout)["calibration"]}
    c1 = calibration["v1-aaaa"]["answers"]
    assert (c1["count"], c1["right"], c1["ece"]) == (3, 1, pytest.approx((0.05 + 2 * 0.35) / 3, abs=1e-4))
    assert [(b["low"], b["count"], b["accuracy"]) for b in c1["bins"]] == [(0.3, 2, 0.0), (0.9, 1, 1.0)]
    assert calibration["v2-bbbb"]["answers"]["count"] == 1  # the other answer has no confidence: unknown

    out = vidlora("eval", seeded.scenario, "--version", "v2")
    assert out.returncode == 0 and "v2-bbbb" in out.stdout and "v1-aaaa" not in out.stdout
    assert "approved" in out.stdout and "finds.material" in out.stdout
    assert "calibration of 1 answers (1 from reviews): ECE 5.0 %" in out.stdout

    out = vidlora("eval", "no_such_scenario")
    assert out.returncode == 1 and "no scenario 'no_such_scenario'" in out.stderr


def test_eval_says_beside_the_calibrated_error_what_chance_alone_gives_on_that_many_answers(database):
    """Issue 61: a "95 %" that is right half the time, over 70 reviewed answers. The map's error
    on answers it was not fitted on comes with what a perfect map shows on them by chance (a coin
    flip's answers scatter around 50 % by some points at this count), so a reader can tell a poor
    map from a small count."""
    seeded = seed_structured([BRONZE] * 70, review_states=["approved", "rejected"] * 35,
                             confidences=[{"sealed": 0.95, "finds": 0.95}] * 70)
    out = vidlora("eval", seeded.scenario, "--json")
    assert out.returncode == 0, out.stderr
    [calibration] = json.loads(out.stdout)["calibration"]
    shown = calibration["calibrated"]
    assert shown["applies"] and shown["folds"] == 5 and 0.03 < shown["ece_floor"] < 0.1
    out = vidlora("eval", seeded.scenario)
    assert out.returncode == 0, out.stderr
    assert (f"ECE {100 * shown['ece_held_out']:.1f} % on answers it was not fitted on (5-fold; "
            f"chance alone: {100 * shown['ece_floor']:.1f} % on this many)") in out.stdout


def test_export_training_writes_what_the_engine_saw_and_holds_gold_out(database, tmp_path):
    seeded = seed_structured([BRONZE, BRONZE, BRONZE, BRONZE])
    approved, edited, gold, unreviewed = seeded.result_ids
    frames = {rid: with_frames(rid) for rid in seeded.result_ids}
    review(approved, "approve")
    review(edited, "edit", fields=JADE)
    review(gold, "approve")
    assert vidlora("gold", "add", str(gold)).returncode == 0
    refused = vidlora("gold", "add", str(unreviewed))
    assert refused.returncode == 1 and "review it first" in refused.stderr

    out = vidlora("export-training", seeded.scenario, "--since", "2020-01-01", "--out", str(tmp_path / "train"))
    assert out.returncode == 0, out.stderr
    assert "2 example(s)" in out.stdout
    rows = [json.loads(line) for line in (tmp_path / "train" / "train.jsonl").read_text().splitlines()]
    assert [r["result_id"] for r in rows] == [approved, edited]
    first = rows[0]
    assert [m["role"] for m in first["messages"]] == ["user", "assistant"]
    assert first["messages"][0]["content"] == "<video>List the finds."
    assert json.loads(rows[1]["messages"][1]["content"]) == JADE  # the reviewed answer, not the model's
    assert rows[1]["messages"][1]["content"].startswith('{"sealed":true,"finds":[{"material":"jade"')
    assert first["video_timestamps"] == [[0.25, 1.25, 2.25]]
    assert [(tmp_path / "train" / p).read_bytes() for p in first["videos"][0]] == frames[approved]
    manifest = json.loads((tmp_path / "train" / "manifest.json").read_text())
    assert manifest["examples"] == 2 and manifest["gold"] == "held out"
    assert manifest["by_review_state"] == {"approved": 1, "edited": 1}
    assert manifest["adapter_versions"] == {"digest-abc": 2} and manifest["reviewed_from"] <= manifest["reviewed_to"]
    # The trainers load JSON Lines through Hugging Face datasets, i.e. pyarrow's JSON reader:
    # every row must have one consistent type per column.
    import pyarrow.json

    table = pyarrow.json.read_json(tmp_path / "train" / "train.jsonl")
    assert table.num_rows == 2 and {"messages", "videos", "video_timestamps"} <= set(table.column_names)
    # ... and the demo model's trainer reads it as it trains from it.
    from demo_model.finetune import read_export

    _, examples = read_export(tmp_path / "train")
    assert [e["answer"] for e in examples] == [r["messages"][-1]["content"] for r in rows]
    assert all(p.is_file() for e in examples for p in e["frames"]) and examples[0]["timestamps"] == [0.25, 1.25, 2.25]
    info = json.loads((tmp_path / "train" / "dataset_info.json").read_text())
    assert info[manifest["dataset_name"]]["columns"] == {"messages": "messages", "videos": "videos"}

    out = vidlora("export-training", seeded.scenario, "--include", "unreviewed", "--out", str(tmp_path / "bad"))
    assert out.returncode == 2 and "include takes" in out.stderr

    # The selections, in process (the command above is the same function): only edited
    # answers; a folder that is not empty is refused; reviews older than --since left out.
    def export(out_dir, **selection):
        from vidlora.feedback.measure import scenario_or_error
        from vidlora.feedback.training_set import Selection, write_training_set

        with session_scope() as session:
            written = write_training_set(session, scenario_or_error(session, seeded.scenario), out_dir,
                                         Path(get_settings().media_root), Selection(**selection))
        return [json.loads(x)["result_id"] for x in (out_dir / "train.jsonl").read_text().splitlines()], written

    assert export(tmp_path / "edited", include=("edited",))[0] == [edited]
    with pytest.raises(TrainingSetError, match="not empty"):
        export(tmp_path / "train")
    with session_scope() as session:
        for r in session.query(Review).filter(Review.result_id == approved):
            r.created_at = utcnow() - timedelta(days=10)
    assert export(tmp_path / "recent", since=utcnow() - timedelta(days=2))[0] == [edited]
    assert export(tmp_path / "all", with_gold=True)[0] == [approved, edited, gold]
    linked, _ = export(tmp_path / "linked", link=True)
    first_frame = json.loads((tmp_path / "linked" / "train.jsonl").read_text().splitlines()[0])["videos"][0][0]
    assert (tmp_path / "linked" / first_frame).stat().st_nlink >= 2  # the media store's file, not a copy

    listed = json.loads(vidlora("gold", "list", seeded.scenario, "--json").stdout)
    assert [g["result_id"] for g in listed["gold"]] == [gold]
    out = vidlora("gold", "export", seeded.scenario, "--out", str(tmp_path / "gold"))
    assert out.returncode == 0, out.stderr
    gold_rows = [json.loads(x) for x in (tmp_path / "gold" / "train.jsonl").read_text().splitlines()]
    assert [r["result_id"] for r in gold_rows] == [gold] and gold_rows[0]["gold"] is True
    assert json.loads((tmp_path / "gold" / "manifest.json").read_text())["set"] == "gold"


def test_an_example_without_its_frames_is_skipped_and_counted(database, tmp_path):
    from vidlora.feedback.measure import scenario_or_error
    from vidlora.feedback.training_set import Selection, write_training_set

    seeded = seed_structured([BRONZE])
    review(seeded.result_ids[0], "approve")  # seed_structured stores no frame files
    with session_scope() as session:
        written = write_training_set(session, scenario_or_error(session, seeded.scenario), tmp_path / "t",
                                     Path(get_settings().media_root), Selection())
    assert written.examples == 0 and written.skipped == {"no stored frames": 1}
    assert json.loads((tmp_path / "t" / "manifest.json").read_text())["skipped"] == {"no stored frames": 1}


def test_scenarios_without_a_subcommand_still_syncs_and_lists(database):
    out = vidlora("scenarios")
    assert out.returncode == 0 and "tomb_structure" in out.stdout.split()


def test_register_takes_the_folder_a_trainer_just_wrote_as_the_readme_types_it(database, tmp_path):
    """README: `python -m demo_model.finetune ... --out v2` then `vidlora scenarios register
    tomb_structure v2`, in the same directory: v2 is the folder there, not one under the adapter root."""
    import os
    import shutil
    import subprocess
    import sys

    from tests.support.env import ROOT

    scenario = seed_structured([]).scenario
    shutil.copytree(ROOT / "demo_model" / "weights" / "adapters" / "tomb_structure", tmp_path / "v2")
    (tmp_path / "v2" / "README.md").write_text(f"v2 of {scenario}\n")  # a version of its own, by content
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "cli", "scenarios", "register", scenario, "v2", "--no-gold-run"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"registered as a candidate from {tmp_path / 'v2'}" in done.stdout
    assert "outside the adapter root" in done.stderr
    missing = subprocess.run([sys.executable, "-m", "cli", "scenarios", "register", scenario, "v3", "--no-gold-run"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and "not an adapter folder" in missing.stderr


def test_an_edit_within_the_number_tolerance_leaves_the_answer_right_as_a_gold_answer_does(database):
    """One rule for right and wrong (issue 61): a reviewer who nudges a confidence by 0.01 (within
    VIDLORA_EVAL_NUMBER_TOLERANCE of its 0..1 range) did not find the answer wrong, in calibration
    as in agreement's field accuracy and the gold comparison; a real correction did."""
    nudged = {"sealed": True, "finds": [{"material": "bronze", "period": "han", "confidence": 0.81}]}
    seeded = seed_structured([BRONZE] * 2, confidences=[{"sealed": 0.9, "finds": 0.9}] * 2)
    review(seeded.result_ids[0], "edit", fields=nudged, version="v1-tol")
    review(seeded.result_ids[1], "edit", fields=JADE, version="v1-tol")
    out = vidlora("eval", seeded.scenario, "--json")
    assert out.returncode == 0, out.stderr
    [version] = json.loads(out.stdout)["versions"]
    assert next(f for f in version["fields"] if f["field"] == "finds.confidence")["right"] == 2
    [calibration] = json.loads(out.stdout)["calibration"]
    assert (calibration["answers"]["count"], calibration["answers"]["right"]) == (2, 1)
    assert calibration["fields"]["right"] == 3  # sealed twice, finds once (the nudge); the jade finds wrong
