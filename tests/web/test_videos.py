from __future__ import annotations

import os

from vidlora.config import get_settings
from vidlora.db import session_scope

XSS = "<script>alert(1)</script><b>x</b>"
XSS_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;&lt;b&gt;x&lt;/b&gt;"


def test_video_page(logged_in_client, factory):
    made = factory.batch({"artifact_identification": "A bronze fibula.", "tomb_structure": None})
    html = logged_in_client.get(f"/videos/{made.video_id}").get_data(as_text=True)
    assert 'data-testid="video-player"' in html and f'src="/videos/{made.video_id}/file"' in html
    assert html.count('data-testid="frame"') == 4
    assert f"/videos/frames/{made.frame_set_id}/3.jpg" in html
    assert "0:09.4" in html  # the 4th frame's timestamp (9.38 s)
    assert "A bronze fibula." in html
    assert "1200 tokens read, 48 written (complete)" in html and "1.25 s" in html and "tiny-qwen" in html and "abc123def456" in html
    assert 'data-testid="health-summary">healthy<' in html and 'data-flag="guard"' in html and 'data-flag="schema"' in html and 'data-flag="all bang"' in html
    result_id = made.result_ids["artifact_identification"]
    assert f'data-testid="approve-{result_id}"' in html and f'data-testid="edit-{result_id}"' in html
    assert "The model is looking at it now" in html  # the running analysis


def test_model_output_is_escaped(logged_in_client, factory):
    made = factory.batch({"artifact_identification": XSS})
    html = logged_in_client.get(f"/videos/{made.video_id}").get_data(as_text=True)
    assert XSS not in html and XSS_ESCAPED in html


def test_frame_served(logged_in_client, factory):
    made = factory.batch()
    response = logged_in_client.get(f"/videos/frames/{made.frame_set_id}/0.jpg")
    assert response.status_code == 200 and response.mimetype == "image/jpeg"
    assert response.data[:3] == b"\xff\xd8\xff"


def test_thumbnail(logged_in_client, factory):
    made = factory.batch()
    response = logged_in_client.get(f"/videos/{made.video_id}/thumbnail.jpg")
    assert response.status_code == 200 and response.mimetype == "image/jpeg"


def test_video_file_supports_range(logged_in_client, factory):
    made = factory.batch()
    full = logged_in_client.get(f"/videos/{made.video_id}/file")
    assert full.status_code == 200 and full.mimetype == "video/mp4"
    assert full.headers["Accept-Ranges"] == "bytes"
    part = logged_in_client.get(f"/videos/{made.video_id}/file", headers={"Range": "bytes=4-11"})
    assert part.status_code == 206 and part.data == full.data[4:12]
    assert part.headers["Content-Range"] == f"bytes 4-11/{len(full.data)}"


def test_unknown_ids(logged_in_client, factory):
    made = factory.batch()
    assert logged_in_client.get("/videos/99999999").status_code == 404
    assert logged_in_client.get("/videos/99999999/file").status_code == 404
    assert logged_in_client.get("/videos/99999999/thumbnail.jpg").status_code == 404
    assert logged_in_client.get("/videos/frames/99999999/0.jpg").status_code == 404
    assert logged_in_client.get(f"/videos/frames/{made.frame_set_id}/4.jpg").status_code == 404


def test_request_paths_never_reach_the_filesystem(logged_in_client, factory):
    made = factory.batch()
    for path in (f"/videos/frames/{made.frame_set_id}/../../../../etc/passwd",
                 f"/videos/frames/{made.frame_set_id}/-1.jpg",
                 f"/videos/frames/{made.frame_set_id}/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
                 "/videos/..%2f..%2fetc%2fpasswd/file",
                 f"/videos/{made.video_id}/file/../../../etc/passwd"):
        response = logged_in_client.get(path)
        assert response.status_code == 404 or b"root:" not in response.data, path
        assert b"root:x:" not in response.data


def test_stored_paths_outside_media_root_are_refused(logged_in_client, factory):
    root = get_settings().media_root
    if not (root / "link-out.jpg").is_symlink():
        os.symlink("/etc/passwd", root / "link-out.jpg")  # inside the root, pointing out of it
    with session_scope() as session:
        video, frame_set = factory.video(session)
        frame_set.files = ["../../../../../../etc/passwd", "/etc/passwd", "link-out.jpg", "frames"]
        video.path = "../../../../../../etc/passwd"
        ids = video.id, frame_set.id
    for index in range(4):
        assert logged_in_client.get(f"/videos/frames/{ids[1]}/{index}.jpg").status_code == 404
    assert logged_in_client.get(f"/videos/{ids[0]}/file").status_code == 404
    page = logged_in_client.get(f"/videos/{ids[0]}")
    assert page.status_code == 200 and b"The video file is not available" in page.data


def test_video_without_frames_or_results(logged_in_client, factory):
    with session_scope() as session:
        video, frame_set = factory.video(session, frames=0)
        session.delete(frame_set)
        video_id = video.id
    html = logged_in_client.get(f"/videos/{video_id}").get_data(as_text=True)
    assert "No frames sampled yet" in html and "No analyses for this video" in html
    assert logged_in_client.get(f"/videos/{video_id}/thumbnail.jpg").status_code == 404


def test_rejected_video_shows_reason(logged_in_client, factory):
    with session_scope() as session:
        video, _ = factory.video(session)
        video.status, video.reason = "rejected", "no decodable video stream"
        video_id = video.id
    html = logged_in_client.get(f"/videos/{video_id}").get_data(as_text=True)
    assert "no decodable video stream" in html and 'data-status="rejected"' in html
    # Issue 19: no empty player and no "frames yet" for a file that will never have them.
    assert 'data-testid="not-playable"' in html and 'data-testid="video-player"' not in html
    assert "No frames sampled yet" not in html


def test_frame_set_pending_not_listed(logged_in_client, factory):
    with session_scope() as session:
        video, frame_set = factory.video(session)
        frame_set.status = "pending"
        video_id = video.id
    assert b"No frames sampled yet" in logged_in_client.get(f"/videos/{video_id}").data


def test_ready_video_is_not_called_queued(logged_in_client, factory):
    made = factory.batch()
    html = logged_in_client.get(f"/videos/{made.video_id}").get_data(as_text=True)
    assert 'data-testid="video-status">ready</span>' in html


def test_a_partial_interlaced_recording_says_so_on_its_page_in_the_api_and_exports(logged_in_client, factory):
    """Issue 31: the span analysed against the span declared, and the deinterlacing, are shown."""
    import csv
    import io
    import json

    from vidlora.models import FrameSet, Video

    made = factory.batch({"artifact_identification": "A bronze fibula."}, video_name="tape.VOB")
    with session_scope() as session:
        video = session.get(Video, made.video_id)
        video.field_order, video.declared_duration_s, video.truncated = "tt", 30.5, True
        video.duration_s = 14.5
        session.get(FrameSet, made.frame_set_id).deinterlace = "bwdif"
    html = logged_in_client.get(f"/videos/{made.video_id}").get_data(as_text=True)
    assert 'data-testid="video-truncated"' in html and "0:14 of it can be decoded" in html and "0:30 its header declares" in html
    assert 'data-testid="video-interlaced"' in html and "top field first" in html
    assert 'data-testid="frame-set-notes">Deinterlaced (bwdif)' in html
    [row] = logged_in_client.get(f"/api/v1/results?batch={made.batch_id}").json["results"]
    assert (row["video_truncated"], row["video_declared_duration_s"], row["video_duration_s"]) == (True, 30.5, 14.5)
    assert (row["video_field_order"], row["frames_deinterlace"]) == ("tt", "bwdif")
    body = logged_in_client.get(f"/results/export.csv?batch={made.batch_id}").get_data(as_text=True)
    [line] = list(csv.DictReader(io.StringIO(body.lstrip("\ufeff"))))
    assert (line["video_truncated"], line["video_declared_duration_s"], line["frames_deinterlace"]) == ("true", "30.5", "bwdif")
    jsonl = json.loads(logged_in_client.get(f"/results/export.jsonl?batch={made.batch_id}").get_data(as_text=True))
    assert jsonl["video_truncated"] is True and jsonl["video_field_order"] == "tt"


def test_a_complete_progressive_video_shows_no_footage_notes(logged_in_client, factory):
    made = factory.batch()
    html = logged_in_client.get(f"/videos/{made.video_id}").get_data(as_text=True)
    assert "video-truncated" not in html and "video-interlaced" not in html and "frame-set-notes" not in html


def test_a_name_shows_what_it_really_is_and_exports_flag_it(logged_in_client, factory):
    """Issue 32: report\\u202Efdp.mp4 showed as "reportpdf.mp4"; exports kept it without a flag."""
    import csv
    import io

    made = factory.batch(video_name="report\u202efdp.mp4")
    page = logged_in_client.get(f"/videos/{made.video_id}").get_data(as_text=True)
    assert "report[U+202E]fdp.mp4" in page and "\u202e" not in page
    listing = logged_in_client.get(f"/results/?batch={made.batch_id}").get_data(as_text=True)
    assert "report[U+202E]fdp.mp4" in listing and "\u202e" not in listing
    body = logged_in_client.get(f"/results/export.csv?batch={made.batch_id}").get_data(as_text=True)
    [row] = list(csv.DictReader(io.StringIO(body.lstrip("\ufeff"))))
    assert row["video_name"] == "report\u202efdp.mp4"  # the data as it is
    assert row["video_name_warning"] == "holds invisible or direction-changing characters: [U+202E]"


def test_the_video_pages_verdict_buttons_carry_the_version(logged_in_client, factory):
    """The video page's Approve is a review action like the review page's: made against the
    version it showed (issue 32), and its engine details are folded away."""
    import re

    made = factory.batch()
    rid = made.result_ids["artifact_identification"]
    html = logged_in_client.get(f"/videos/{made.video_id}").get_data(as_text=True)
    form = html.split(f'action="/review/results/{rid}"')[1].split("</form>")[0]
    version = re.search(r'name="version" value="(\d+)"', form).group(1)
    assert '<details class="engine" data-testid="engine-details">' in html and ">Stopped<" not in html
    response = logged_in_client.post(f"/review/results/{rid}", data={
        "csrf_token": logged_in_client.csrf, "next": f"/videos/{made.video_id}", "version": version, "action": "approve"})
    assert response.status_code == 303 and response.headers["Location"] == f"/videos/{made.video_id}"
    again = logged_in_client.post(f"/review/results/{rid}", data={
        "csrf_token": logged_in_client.csrf, "version": version, "action": "reject"})  # the page from before
    assert again.status_code == 409


def test_a_structured_answer_shows_as_labelled_fields_on_the_video_page(logged_in_client, database):
    """Issue 32: the video page showed raw JSON answers."""
    from tests.support.structured import seed_structured

    seeded = seed_structured([{"sealed": True, "finds": [{"material": "bronze", "period": "han", "confidence": 0.9}]}])
    with session_scope() as session:
        from vidlora.models import Analysis
        video_id = session.get(Analysis, seeded.analysis_ids[0]).video_id
    html = logged_in_client.get(f"/videos/{video_id}").get_data(as_text=True)
    import re

    answer = re.sub(r"\s+", " ", html.split('data-testid="result-answer">')[1].split("</div>")[0])
    assert "<dt>material</dt>" in answer and 'data-field="material"> bronze' in answer
    assert "<summary>As JSON</summary>" in html
