from __future__ import annotations

from tests.support.web import review_version
from vidlora.db import session_scope
from vidlora.models import Result, Review
from web.review.diff import word_diff

XSS = "<script>alert(1)</script><b>x</b>"
XSS_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;&lt;b&gt;x&lt;/b&gt;"


def _act(client, result_id, **form):
    """A post from the result's page as it reads now (its form carries the review version)."""
    if "version" not in form:
        form["version"] = review_version(client, result_id)
    return client.post(f"/review/results/{result_id}", data={"csrf_token": client.csrf, **form})


def _result(result_id) -> tuple[Result, list[Review]]:
    with session_scope() as session:
        result = session.get(Result, result_id)
        return result, list(result.reviews)


def test_review_page(logged_in_client, factory):
    made = factory.batch()
    rid = made.result_ids["artifact_identification"]
    html = logged_in_client.get(f"/review/results/{rid}").get_data(as_text=True)
    for testid in ("review-form", f"approve-{rid}", f"reject-{rid}", f"edit-{rid}", "edit-text", "history"):
        assert f'data-testid="{testid}"' in html
    assert "A bronze fibula with incised decoration." in html


def test_review_page_shows_the_video_and_the_frames_this_result_saw(logged_in_client, factory):
    made = factory.batch()
    rid = made.result_ids["artifact_identification"]
    html = logged_in_client.get(f"/review/results/{rid}").get_data(as_text=True)
    assert f'src="/videos/{made.video_id}/file"' in html and 'id="player"' in html
    assert f'data-frame-set-id="{made.frame_set_id}"' in html
    # four frames over 12.5 s, each a seek target at its own time, captioned with it
    for i, t in enumerate([0.0, 3.12, 6.25, 9.38]):
        assert f'href="/videos/frames/{made.frame_set_id}/{i}.jpg" data-time="{t}"' in html
    assert "<figcaption>0:06.2" in html or "<figcaption>0:06.3" in html
    assert logged_in_client.get(f"/videos/frames/{made.frame_set_id}/3.jpg").status_code == 200
    assert "video.js" in html


def test_review_queue_redirects_to_unreviewed(logged_in_client, database):
    response = logged_in_client.get("/review/")
    assert response.status_code == 302
    assert "review_state=unreviewed" in response.headers["Location"]
    assert "sort=uncertain" in response.headers["Location"]  # the model's doubts first (issue 51)


def test_approve(logged_in_client, factory, reviewer_id):
    rid = factory.batch().result_ids["artifact_identification"]
    response = _act(logged_in_client, rid, action="approve", note="checked against the finds register")
    assert response.status_code == 303 and response.headers["Location"] == f"/review/results/{rid}"
    result, reviews = _result(rid)
    assert result.review_state == "approved"
    assert [(r.action, r.user_id, r.note) for r in reviews] == [("approve", reviewer_id, "checked against the finds register")]
    html = logged_in_client.get(f"/review/results/{rid}").get_data(as_text=True)
    assert "reviewer" in html and "approved" in html and "checked against the finds register" in html


def test_reject_from_video_page_returns_there(logged_in_client, factory):
    made = factory.batch()
    rid = made.result_ids["artifact_identification"]
    response = _act(logged_in_client, rid, action="reject", next=f"/videos/{made.video_id}")
    assert response.headers["Location"] == f"/videos/{made.video_id}"
    assert _result(rid)[0].review_state == "rejected"
    assert _act(logged_in_client, rid, action="approve", next="https://evil.example/").headers["Location"] == \
        f"/review/results/{rid}"


def test_edit_keeps_original_and_shows_diff(logged_in_client, factory):
    rid = factory.batch({"artifact_identification": "A bronze fibula, Roman."}).result_ids["artifact_identification"]
    _act(logged_in_client, rid, action="edit", text="A bronze fibula, late Roman.\r\n", note="period")
    result, reviews = _result(rid)
    assert result.text == "A bronze fibula, Roman."
    assert result.edited_text == "A bronze fibula, late Roman.\n"
    assert result.review_state == "edited"
    assert reviews[-1].action == "edit" and reviews[-1].text == result.edited_text
    html = logged_in_client.get(f"/review/results/{rid}").get_data(as_text=True)
    assert "<ins>late </ins>" in html or "<ins>late" in html
    assert 'data-testid="original-text">A bronze fibula, Roman.<' in html
    # a second edit is diffed against the first one in the history
    _act(logged_in_client, rid, action="edit", text="A bronze fibula, late Roman (4th c.).")
    assert len(_result(rid)[1]) == 2


def test_edit_with_markup_is_escaped_everywhere(logged_in_client, factory):
    made = factory.batch({"artifact_identification": XSS})
    rid = made.result_ids["artifact_identification"]
    html = logged_in_client.get(f"/review/results/{rid}").get_data(as_text=True)
    assert XSS not in html and XSS_ESCAPED in html
    _act(logged_in_client, rid, action="edit", text=XSS + " <i>more</i>", note="<img src=x onerror=alert(2)>")
    html = logged_in_client.get(f"/review/results/{rid}").get_data(as_text=True)
    assert "<script>" not in html and "<img src=x" not in html and "<i>more</i>" not in html
    assert "&lt;i&gt;more&lt;/i&gt;" in html


def test_invalid_reviews(logged_in_client, factory):
    rid = factory.batch().result_ids["artifact_identification"]
    unchanged = _act(logged_in_client, rid, action="edit", text="A bronze fibula with incised decoration.")
    assert unchanged.status_code == 400 and b"unchanged" in unchanged.data
    empty = _act(logged_in_client, rid, action="edit", text="   ")
    assert empty.status_code == 400 and b"empty" in empty.data
    assert _act(logged_in_client, rid, action="note", note="").status_code == 400
    assert _act(logged_in_client, rid, action="delete").status_code == 400
    result, reviews = _result(rid)
    assert result.review_state == "unreviewed" and reviews == [] and result.edited_text is None


def test_note_does_not_change_state(logged_in_client, factory):
    rid = factory.batch().result_ids["artifact_identification"]
    assert _act(logged_in_client, rid, action="note", note="ask Maria about the pin").status_code == 303
    result, reviews = _result(rid)
    assert result.review_state == "unreviewed" and reviews[0].action == "note"


def test_review_needs_csrf(logged_in_client, factory):
    rid = factory.batch().result_ids["artifact_identification"]
    response = logged_in_client.post(f"/review/results/{rid}", data={"action": "approve"})
    assert response.status_code == 403
    assert _result(rid)[0].review_state == "unreviewed"


def test_unknown_result(logged_in_client, database):
    assert logged_in_client.get("/review/results/99999999").status_code == 404
    assert _act(logged_in_client, 99999999, action="approve", version="0").status_code == 404


def test_word_diff():
    assert word_diff("a red pot", "a black pot") == [("same", "a "), ("del", "red"), ("ins", "black"), ("same", " pot")]
    assert word_diff("same", "same") == [("same", "same")]


def test_approve_keeps_a_typed_correction(logged_in_client, factory):
    """A reviewer who corrects the text and presses Approve approves the correction (issue 19)."""
    rid = factory.batch().result_ids["artifact_identification"]
    response = _act(logged_in_client, rid, action="approve", text="A bronze fibula, La Tène.\r\n")
    assert response.status_code == 303
    result, reviews = _result(rid)
    assert result.edited_text == "A bronze fibula, La Tène.\n" and result.review_state == "approved"
    assert [r.action for r in reviews] == ["edit", "approve"]
    assert "Edit saved and approved." in logged_in_client.get(f"/review/results/{rid}").get_data(as_text=True)
    _act(logged_in_client, rid, action="approve", text="A bronze fibula, La Tène.\n")  # unchanged: no edit
    assert [r.action for r in _result(rid)[1]] == ["edit", "approve", "approve"]


def test_a_text_starting_with_a_line_break_survives_the_edit_box(logged_in_client, factory):
    rid = factory.batch({"artifact_identification": "\nA bronze fibula."}).result_ids["artifact_identification"]
    html = logged_in_client.get(f"/review/results/{rid}").get_data(as_text=True)
    assert 'data-testid="edit-text">\n\nA bronze fibula.</textarea>' in html  # the parser eats the first


def test_the_review_queue_walks_a_filtered_list(logged_in_client, factory):
    """Issue 19: opened from a results list, the review page moves through that list, and
    Approve / Reject / Save go on to the next result nobody has reviewed."""
    import re

    made = factory.batch({"artifact_identification": "one", "tomb_structure": "two", "murals_inscriptions": "three"})
    order = sorted(made.result_ids.values(), reverse=True)  # the list's order: newest first
    listing = logged_in_client.get(f"/results/?batch={made.batch_id}").get_data(as_text=True)
    link = re.search(rf'href="([^"]+)" data-testid="review-link-{order[0]}"', listing).group(1).replace("&amp;", "&")
    assert "queue=1" in link and f"batch={made.batch_id}" in link
    page = logged_in_client.get(link).get_data(as_text=True)
    assert "1 of 3 in this list" in page and 'data-testid="queue-next"' in page and "queue-prev" not in page
    assert 'data-testid="shortcuts"' in page and "review.js" in page
    query = link.split("?", 1)[1]
    _act_q = lambda rid, **form: logged_in_client.post(  # noqa: E731
        f"/review/results/{rid}?{query}",
        data={"csrf_token": logged_in_client.csrf, "version": review_version(logged_in_client, rid), **form})
    first = _act_q(order[0], action="approve")
    assert first.status_code == 303 and first.headers["Location"].startswith(f"/review/results/{order[1]}?")
    assert _act_q(order[2], action="reject").headers["Location"].startswith(f"/review/results/{order[1]}?")
    last = _act_q(order[1], action="edit", text="two, corrected")
    assert last.headers["Location"].startswith("/results/?") and f"batch={made.batch_id}" in last.headers["Location"]
    assert "Nothing left to review in this list." in logged_in_client.get(last.headers["Location"]).get_data(as_text=True)
