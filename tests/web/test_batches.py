from __future__ import annotations

import json
import re

from vidlora.db import session_scope
from vidlora.models import Batch, BatchItem, FrameSet


def test_batch_list(logged_in_client, factory):
    made = factory.batch({"artifact_identification": "done text", "tomb_structure": None}, name="List me")
    page = logged_in_client.get("/batches/")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert f'data-batch-id="{made.batch_id}"' in html and "List me" in html
    assert "1 done · 1 to go, of 2" in html
    row = html.split(f'data-batch-id="{made.batch_id}"')[1].split("</tr>")[0]
    assert "Artifact identification, Tomb structure analysis" in row  # titles, not names
    assert _segments(row) == {"done": ("1", "50.000"), "failed": ("0", "0.000"), "rejected": ("0", "0.000")}


def _segments(html: str) -> dict[str, tuple[str, str]]:
    """The outcome bar's segments: status -> (count, width in percent)."""
    return {m[0]: (m[1], m[2]) for m in re.findall(
        r'data-segment="(\w+)" data-count="(\d+)" x="[\d.]+" y="0" width="([\d.]+)"', html)}


def test_a_batch_whose_work_was_refused_never_reads_as_fine(logged_in_client, factory):
    """Issue 19: rejected videos and refused files show as problems, in the list and its JSON."""
    made = factory.batch({"artifact_identification": "x", "tomb_structure": None, "murals_inscriptions": None},
                         statuses={"tomb_structure": "rejected", "murals_inscriptions": "failed"})
    with session_scope() as session:
        session.add(BatchItem(batch_id=made.batch_id, name="notes.txt.mp4", status="rejected", reason="not a video"))
    html = logged_in_client.get("/batches/").get_data(as_text=True)
    row = html.split(f'data-batch-id="{made.batch_id}"')[1].split("</tr>")[0]
    assert "1 done · 1 failed · 1 not analysable, of 3 · 1 file rejected" in row
    assert 'data-problems="3"' in row and "3 with problems" in row
    data = logged_in_client.get(f"/batches/progress.json?ids={made.batch_id}").json[str(made.batch_id)]
    assert data["finished"] is True and data["problems"] == 3 and data["files_rejected"] == 1
    assert data["text"] == "1 done · 1 failed · 1 not analysable, of 3 · 1 file rejected"


def test_an_archive_whose_members_were_all_refused_says_so(logged_in_client, database):
    with session_scope() as session:
        batch = Batch(name="all bad", source="web", scenario_names=["tomb_structure"], status="ingested")
        session.add(batch)
        session.flush()
        session.add_all([BatchItem(batch_id=batch.id, name=f"m{i}.mp4", status="rejected", reason="truncated")
                         for i in range(2)])
        batch_id = batch.id
    row = logged_in_client.get("/batches/").get_data(as_text=True).split(f'data-batch-id="{batch_id}"')[1]
    assert "no analyses · 2 files rejected" in row.split("</tr>")[0] and "2 with problems" in row


def test_batch_list_paginates(logged_in_client, factory, app, monkeypatch):
    factory.batch(name="page one")
    factory.batch(name="page two")
    monkeypatch.setitem(app.config, "PAGE_SIZE", 1)
    first = logged_in_client.get("/batches/").get_data(as_text=True)
    assert "page two" in first and "page one" not in first and 'rel="next"' in first
    assert "page two" not in logged_in_client.get("/batches/?page=2").get_data(as_text=True)


def test_progress_json(logged_in_client, factory):
    made = factory.batch({"artifact_identification": "x", "tomb_structure": None})
    data = logged_in_client.get(f"/batches/progress.json?ids={made.batch_id},abc,99999999").json
    assert list(data) == [str(made.batch_id)]
    progress = data[str(made.batch_id)]
    assert progress["total"] == 2 and progress["final"] == 1 and progress["finished"] is False
    assert logged_in_client.get("/batches/progress.json").json == {}


def test_batch_detail_shows_each_cell(logged_in_client, factory):
    made = factory.batch({"artifact_identification": "x", "tomb_structure": None, "murals_inscriptions": None},
                         statuses={"tomb_structure": "ready", "murals_inscriptions": "failed"})
    with session_scope() as session:
        session.add(BatchItem(batch_id=made.batch_id, name="notes.txt", status="skipped", reason="not a video"))
        session.add(BatchItem(batch_id=made.batch_id, name="broken.mp4", status="rejected", reason="no video stream"))
    html = logged_in_client.get(f"/batches/{made.batch_id}").get_data(as_text=True)
    vid = made.video_id
    assert f'data-testid="cell-{vid}-artifact_identification" data-scenario="artifact_identification" data-status="done"' in html
    assert f'data-testid="cell-{vid}-tomb_structure" data-scenario="tomb_structure" data-status="ready"' in html
    assert ">queued</span>" in html  # ready is shown as queued
    assert "decoder gave up" in html  # the failure reason
    assert "broken.mp4" in html and "no video stream" in html
    assert "notes.txt" in html and "left out: not a video" in html
    assert f'data-status-url="/batches/{made.batch_id}/status.json"' in html
    # Issue 19: titles for columns; a done cell opens its result; the bar counts what failed.
    assert '<th data-scenario="tomb_structure" title="tomb_structure">Tomb structure analysis</th>' in html
    rid = made.result_ids["artifact_identification"]
    cell = html.split(f'data-testid="cell-{vid}-artifact_identification"')[1].split("</td>")[0]
    assert f'<a href="/review/results/{rid}" data-testid="result-link">' in cell
    assert "result-link" not in html.split(f'data-testid="cell-{vid}-murals_inscriptions"')[1].split("</td>")[0]
    assert _segments(html) == {"done": ("1", "33.333"), "failed": ("1", "33.333"), "rejected": ("0", "0.000")}
    assert 'id="batch-bar" data-testid="batch-bar"' in html  # batch.js redraws it by this id
    # The page's script names statuses from the same table as the first render.
    vocabulary = json.loads(html.split("data-vocabulary='")[1].split("'")[0])
    assert vocabulary["analysis"]["ready"][0] == "queued" and vocabulary["video"]["probing"][0] == "checking"


def test_status_json(logged_in_client, factory):
    made = factory.batch({"artifact_identification": "x", "tomb_structure": None})
    data = logged_in_client.get(f"/batches/{made.batch_id}/status.json").json
    assert data["finished"] is False and data["counts"] == {"done": 1, "running": 1}
    video = data["videos"][0]
    assert video["url"] == f"/videos/{made.video_id}"
    assert video["thumb_url"] == f"/videos/{made.video_id}/thumbnail.jpg"
    assert {a["scenario"]: a["status"] for a in video["analyses"]} == {
        "artifact_identification": "done", "tomb_structure": "running"}
    assert {a["scenario"]: a["result_url"] for a in video["analyses"]} == {
        "artifact_identification": f"/review/results/{made.result_ids['artifact_identification']}", "tomb_structure": None}
    assert data["titles"] == {"artifact_identification": "Artifact identification", "tomb_structure": "Tomb structure analysis"}


def test_a_video_without_frames_shows_a_placeholder_not_a_broken_image(logged_in_client, factory):
    made = factory.batch({"artifact_identification": None}, statuses={"artifact_identification": "pending"})
    with session_scope() as session:
        session.get(FrameSet, made.frame_set_id).status = "pending"
    assert logged_in_client.get(f"/batches/{made.batch_id}/status.json").json["videos"][0]["thumb_url"] is None
    html = logged_in_client.get(f"/batches/{made.batch_id}").get_data(as_text=True)
    assert 'data-testid="thumb-placeholder"' in html and f"/videos/{made.video_id}/thumbnail.jpg" not in html


def test_finished_batch(logged_in_client, factory):
    made = factory.batch({"artifact_identification": "x"})
    assert logged_in_client.get(f"/batches/{made.batch_id}/status.json").json["finished"] is True
    assert 'data-finished="true"' in logged_in_client.get(f"/batches/{made.batch_id}").get_data(as_text=True)


def test_ingesting_batch_without_videos(logged_in_client, database):
    with session_scope() as session:
        batch = Batch(name="arriving", source="web", scenario_names=["tomb_structure"], status="ingesting")
        session.add(batch)
        session.flush()
        batch_id = batch.id
    html = logged_in_client.get(f"/batches/{batch_id}").get_data(as_text=True)
    assert "Receiving files…" in html and 'data-finished="false"' in html


def test_unknown_batch(logged_in_client, database):
    assert logged_in_client.get("/batches/99999999").status_code == 404
    assert logged_in_client.get("/batches/99999999/status.json").status_code == 404


def test_the_batch_page_says_finished_with_problems(logged_in_client, factory):
    made = factory.batch({"artifact_identification": None}, statuses={"artifact_identification": "rejected"})
    html = logged_in_client.get(f"/batches/{made.batch_id}").get_data(as_text=True)
    assert "Finished with problems" in html and "1 not analysable, of 1" in html
    data = logged_in_client.get(f"/batches/{made.batch_id}/status.json").json
    assert data["outcome"] == "1 not analysable, of 1" and data["problems"] == 1


def test_a_re_upload_says_which_earlier_batch_its_results_come_from(logged_in_client, factory):
    """The same content uploaded again reuses the earlier analysis (vidlora.batches) and the
    new batch's page says so, linking the batch that did the work."""
    from pathlib import Path

    from vidlora.batches import record_member
    from vidlora.config import get_settings
    from vidlora.ingest.store import StoredFile
    from vidlora.models import Video

    first = factory.batch()
    media_root = Path(get_settings().media_root)
    with session_scope() as session:
        video = session.get(Video, first.video_id)
        again = Batch(name="again", source="web", scenario_names=["artifact_identification"], status="ingested")
        session.add(again)
        session.flush()
        stored = StoredFile(video.sha256, media_root / video.path, video.size_bytes, existed=True)
        assert record_member(session, again.id, "copy of trench.mp4", "stored", None, stored, media_root)[0] == video.id
        again_id = again.id
    data = logged_in_client.get(f"/batches/{again_id}/status.json").json
    [analysis] = data["videos"][0]["analyses"]
    assert analysis["reused_from"] == first.batch_id and analysis["reused_url"] == f"/batches/{first.batch_id}"
    assert data["reused"] == {str(first.batch_id): 1}
    html = logged_in_client.get(f"/batches/{again_id}").get_data(as_text=True)
    assert 'data-testid="reused-notice"' in html and f'<a href="/batches/{first.batch_id}">batch {first.batch_id}</a>' in html
    assert 'data-testid="reused-from"' in html
    # the first batch's own page does not call its work reused
    assert "reused-notice" not in logged_in_client.get(f"/batches/{first.batch_id}").get_data(as_text=True)


def test_a_batch_that_came_to_nothing_finished_with_problems_in_every_view(logged_in_client, database):
    """Issue 32: a zip with no videos read "Finished", and a finished batch "ingested" in the API."""
    from click.testing import CliRunner

    from cli.main import status as status_command

    with session_scope() as session:
        batch = Batch(name="notes only", source="web", scenario_names=["tomb_structure"], status="ingested")
        session.add(batch)
        session.flush()
        session.add(BatchItem(batch_id=batch.id, name="notes.txt", status="skipped", reason="not_video: a .txt file"))
        batch_id = batch.id
    html = logged_in_client.get(f"/batches/{batch_id}").get_data(as_text=True)
    assert "Finished with problems" in html
    assert logged_in_client.get(f"/api/v1/batches/{batch_id}").json["state"] == "finished with problems"
    listed = {b["id"]: b for b in logged_in_client.get("/api/v1/batches").json["batches"]}
    assert listed[batch_id]["progress"]["state"] == "finished with problems"
    out = CliRunner().invoke(status_command, [str(batch_id)])
    assert "[finished with problems]" in out.output and "ingested" not in out.output


def test_reasons_read_as_sentences_on_the_batch_page(logged_in_client, database):
    """Issue 32: `hidden: dotfile`, `corrupt: BadZipFile`, `<archive>` on the page."""
    with session_scope() as session:
        batch = Batch(name="mixed", source="web", scenario_names=["tomb_structure"], status="ingested")
        session.add(batch)
        session.flush()
        session.add_all([
            BatchItem(batch_id=batch.id, name=".DS_Store", status="skipped", reason="hidden: dotfile"),
            BatchItem(batch_id=batch.id, name="<archive>", status="rejected",
                      reason="corrupt: BadZipFile: File is not a zip file")])
        batch_id = batch.id
    html = logged_in_client.get(f"/batches/{batch_id}").get_data(as_text=True)
    assert "A hidden file (its name starts with a dot), left out." in html and "hidden: dotfile</li>" not in html
    assert "the archive as a whole</strong> — not analysed: Damaged, or not what its name says (File is not a zip file)." in html
    data = logged_in_client.get(f"/batches/{batch_id}/status.json").json  # what the page's script redraws from
    assert {m["label"]: m["words"] for m in data["rejected"]} == {
        "the archive as a whole": "Damaged, or not what its name says (File is not a zip file)."}
