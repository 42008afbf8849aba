from __future__ import annotations

from vidlora.db import session_scope
from vidlora.models import Batch, BatchItem


def test_batch_list(logged_in_client, factory):
    made = factory.batch({"artifact_identification": "done text", "tomb_structure": None}, name="List me")
    page = logged_in_client.get("/batches/")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert f'data-batch-id="{made.batch_id}"' in html and "List me" in html
    assert "1 done · 1 to go, of 2" in html


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
    assert "notes.txt" in html and "skipped: not a video" in html
    assert f'data-status-url="/batches/{made.batch_id}/status.json"' in html


def test_status_json(logged_in_client, factory):
    made = factory.batch({"artifact_identification": "x", "tomb_structure": None})
    data = logged_in_client.get(f"/batches/{made.batch_id}/status.json").json
    assert data["finished"] is False and data["counts"] == {"done": 1, "running": 1}
    video = data["videos"][0]
    assert video["url"] == f"/videos/{made.video_id}"
    assert video["thumb_url"] == f"/videos/{made.video_id}/thumbnail.jpg"
    assert {a["scenario"]: a["status"] for a in video["analyses"]} == {
        "artifact_identification": "done", "tomb_structure": "running"}


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
    assert "Receiving and checking files" in html and 'data-finished="false"' in html


def test_unknown_batch(logged_in_client, database):
    assert logged_in_client.get("/batches/99999999").status_code == 404
    assert logged_in_client.get("/batches/99999999/status.json").status_code == 404


def test_the_batch_page_says_finished_with_problems(logged_in_client, factory):
    made = factory.batch({"artifact_identification": None}, statuses={"artifact_identification": "rejected"})
    html = logged_in_client.get(f"/batches/{made.batch_id}").get_data(as_text=True)
    assert "Finished with problems" in html and "1 not analysable, of 1" in html
    data = logged_in_client.get(f"/batches/{made.batch_id}/status.json").json
    assert data["outcome"] == "1 not analysable, of 1" and data["problems"] == 1
