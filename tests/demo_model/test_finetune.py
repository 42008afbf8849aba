"""demo_model.finetune reads an export as a trainer does, and refuses one that is not what the
format says (the export itself is written and read back in tests/cli/test_feedback.py; the
training run from it is in tests/system/pipelines/test_feedback_loop.py)."""

from __future__ import annotations

import json

import pytest

from demo_model.finetune import ExportError, read_export


def write(folder, rows):
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"file": "train.jsonl"}))
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def row(messages, videos=(("frames/1/0000.jpg",),), stamps=((0.5,),)):
    return {"messages": messages, "videos": [list(v) for v in videos], "video_timestamps": [list(t) for t in stamps]}


USER = {"role": "user", "content": "<video>Count the chambers."}
ANSWER = {"role": "assistant", "content": '{"chamber_count":2}'}


def test_a_well_formed_export_reads_as_prompt_frames_and_answer(tmp_path):
    folder = write(tmp_path / "ok", [row([{"role": "system", "content": "You survey tombs."}, USER, ANSWER])])
    _, [example] = read_export(folder)
    assert (example["system"], example["prompt"], example["answer"]) == ("You survey tombs.", "Count the chambers.",
                                                                         '{"chamber_count":2}')
    assert example["frames"] == [folder / "frames/1/0000.jpg"] and example["timestamps"] == [0.5]


@pytest.mark.parametrize("bad, why", [
    (row([ANSWER, USER]), "messages must be"),
    (row([{"role": "user", "content": "Count the chambers."}, ANSWER]), "placeholder"),
    (row([USER, ANSWER], stamps=((0.5, 1.0),)), "1 frames but 2 timestamps"),
])
def test_a_row_that_breaks_the_format_is_refused_with_its_line(tmp_path, bad, why):
    with pytest.raises(ExportError, match=f"line 1: .*{why}"):
        read_export(write(tmp_path / "bad", [bad]))
