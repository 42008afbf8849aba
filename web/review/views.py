from __future__ import annotations

import json

from flask import abort, flash, jsonify, redirect, render_template, request, url_for
from flask_login import current_user
from sqlalchemy import select
from sqlalchemy.orm import selectinload

from vidlora.feedback.gold import GoldError, set_gold
from vidlora.lifecycle import AnalysisStatus, FrameSetStatus, ReviewState
from vidlora.models import Analysis, Result, Review
from vidlora.config import get_settings
from vidlora.digits import whole_number
from vidlora.results.fields import changes, final_value, in_schema_order
from vidlora.results.query import FilterError, ResultFilters, neighbours, parse_filters
from web.database import get_db
from web.review import bp, leases
from web.review.actions import (
    ReviewError,
    StaleReview,
    answer_at,
    apply_review,
    current_text,
    history,
    load_for_review,
    output_schema,
)
from web.review.certainty import certainty_tree
from web.review.diff import word_diff
from web.review.merge import Removed, merge3
from web.review.schema_form import FormError, as_posted, form_tree, read_form
from web.security import safe_next
from web.videos.media import media_file

DONE_MESSAGES = {"approve": "Approved.", "reject": "Rejected.", "edit": "Edit saved.", "note": "Note added."}


def _result_or_404(result_id: int) -> Result:
    result = get_db().get(
        Result, result_id,
        options=[selectinload(Result.reviews).selectinload(Review.user),
                 selectinload(Result.analysis).selectinload(Analysis.video),
                 selectinload(Result.analysis).selectinload(Analysis.scenario),
                 selectinload(Result.analysis).selectinload(Analysis.frame_set)],
    )
    if result is None:
        abort(404, f"There is no result {result_id}.")
    return result


@bp.get("/")
def index():
    """The review queue: finished results nobody has looked at yet, the model's doubts first
    (answers without a confidence after them, oldest first)."""
    return redirect(url_for("query.index", status=AnalysisStatus.DONE, review_state=ReviewState.UNREVIEWED,
                            sort="uncertain"))


def _json(text: str | None):
    try:
        return json.loads(text) if text is not None else None
    except ValueError:
        return None


def _queue() -> tuple[ResultFilters | None, dict]:
    """The review queue this page was opened from (a results list's filter), if any."""
    if request.args.get("queue") != "1":
        return None, {}
    try:
        filters = parse_filters(request.args)
    except FilterError:
        return None, {}
    return filters, {**filters.as_args(), "queue": "1"}


def _page(result: Result, error: str | None = None, draft=None, note: str = "", status: int = 200,
          stale: StaleReview | None = None, action: str = "", merged: list[str] | None = None):
    schema = output_schema(result)
    filters, queue_args = _queue()
    try:
        around = neighbours(get_db(), filters, result.id) if filters is not None else None
    except FilterError:
        around = None
    if schema is None:
        entries = [(review, word_diff(before, review.text) if before is not None else None, None)
                   for review, before in history(result)]
        diff = word_diff(result.text, result.edited_text) if result.edited_text is not None else None
        field_diff, form = None, None
    else:
        # A structured answer is shown, edited and compared field by field.
        entries = [(review, None, changes(_json(before), _json(review.text)) if before is not None else None)
                   for review, before in history(result)]
        diff = None
        field_diff = changes(result.parsed, result.edited_parsed) if result.edited_parsed is not None else None
        form = form_tree(schema, final_value(result) if draft is None else draft)
    conflict = _conflict(result, entries, stale, action, draft, schema, merged) if stale is not None else None
    held_by = leases.holder(get_db(), result.id, current_user.id)
    # This page holds the answer while it is open (opened from the queue, nobody else has it).
    holding = filters is not None and held_by is None and result.review_state == ReviewState.UNREVIEWED
    analysis = result.analysis
    frame_set = analysis.frame_set if analysis.frame_set and analysis.frame_set.status == FrameSetStatus.DONE else None
    return render_template(
        "review/result.html", frame_set=frame_set, playable=media_file(analysis.video.path) is not None,
        result=result, analysis=result.analysis, video=result.analysis.video,
        certainty=certainty_tree(result.field_confidences, result.parsed),
        scenario=result.analysis.scenario, history=entries, diff=diff, field_diff=field_diff, form=form,
        answer=in_schema_order(final_value(result), schema), error=error, around=around, queue_args=queue_args,
        draft=current_text(result) if draft is None or schema is not None else draft, note=note, conflict=conflict,
        held_by=held_by, holding=holding, lease_s=get_settings().review_lease_s,
    ), status


def _conflict(result: Result, entries: list, stale: StaleReview, action: str, draft, schema,
              both: list[str] | None) -> dict:
    """What the other reviewers did since this reviewer's page was loaded, beside what this
    reviewer tried: the form below keeps their draft and now carries the current version, so
    pressing the same button again applies it over the other change, on purpose."""
    since = [entry for entry in entries if entry[0].version is not None and entry[0].version > stale.seen]
    yours_text = yours_fields = None
    if action in ("edit", "approve") and draft is not None:
        if schema is not None:
            yours_fields = changes(final_value(result), draft) or None
        elif draft.replace("\r\n", "\n") != current_text(result):
            yours_text = word_diff(current_text(result), draft.replace("\r\n", "\n"))
    conflicts = both or []
    return {"since": since, "action": action, "text": yours_text, "fields": yours_fields, "seen": stale.seen,
            "both": [p for p in conflicts if not isinstance(p, Removed)],
            "removed": [p for p in conflicts if isinstance(p, Removed)]}


def _corrected(result: Result, text: str | None, fields) -> bool:
    if fields is not None:
        schema = output_schema(result)
        return fields != read_form(schema, as_posted(form_tree(schema, final_value(result))))
    return text is not None and text.replace("\r\n", "\n").replace("\r", "\n") != current_text(result)


def _reapply(result: Result, schema, draft, seen: int) -> tuple[object, list[str] | None]:
    """What the form offers after a conflict: the reviewer's own changes (from the answer
    their page showed, at version ``seen``) applied to the answer as it is now, and for a
    structured one the fields both changed. A draft they did not touch is only the old answer:
    offering it again would revert the other change, so the form shows the current answer."""
    before = answer_at(result, seen)
    if draft is None:
        return None, None
    if schema is None:
        typed = draft.replace("\r\n", "\n").replace("\r", "\n") != before
        return (draft if typed else None), None
    shown = read_form(schema, as_posted(form_tree(schema, before)))  # what the form held, as posted
    return merge3(shown, final_value(result), draft)


@bp.get("/results/<id:result_id>")
def result(result_id: int):
    result = _result_or_404(result_id)
    filters, queue_args = _queue()
    if filters is not None and result.review_state == ReviewState.UNREVIEWED:
        # Opened from the queue: hold it, or, when a colleague holds it, hand over the next free one.
        session = get_db()
        mine, held = _hold(session, result_id)
        if not mine:
            following = _next_free(session, filters, result_id)
            session.commit()
            if following is not None:
                flash(f"{held.username} is reviewing result {result_id}; here is the next answer nobody has open."
                      if held else f"Result {result_id} was reviewed a moment ago; here is the next answer nobody "
                      "has open.", "info")
                return redirect(url_for("review.result", result_id=following, **queue_args), code=303)
            if held is None:  # reviewed since it was read: show it as it is now
                session.expire(result)
                result = _result_or_404(result_id)
        session.commit()
    return _page(result)


def _hold(session, result_id: int) -> tuple[bool, leases.Holder | None]:
    """Hold an unreviewed result for this reviewer: (True, None) when they now hold it,
    (False, the colleague) when a colleague does, (False, None) when it was reviewed after
    this request read it. A colleague may approve it and let go of it between that read and
    this hold (their whole review in the meantime, on a busy server): without the check the
    page would offer the answer at its old version, and Approve would meet a conflict."""
    held = leases.take(session, result_id, current_user.id)
    if held is not None:
        return False, held
    now = session.scalar(select(Result.review_state).where(Result.id == result_id))  # a fresh read
    if now != ReviewState.UNREVIEWED:
        leases.release(session, result_id, current_user.id)
        return False, None
    return True, None


def _next_free(session, filters: ResultFilters, result_id: int) -> int | None:
    """The next unreviewed result of the queue after ``result_id`` that nobody else holds, now
    held for this reviewer. A colleague may take the same one at the same moment, or review it
    in between: then the one after it (a few tries; past them, the answer even if held: a
    lease is a courtesy)."""
    leases.sweep(session)  # holds that ran out count for nothing; this keeps their table small
    candidate = None
    for _ in range(5):
        candidate = neighbours(session, filters, result_id, leases.held_by_others(current_user.id)).next_unreviewed
        if candidate is None or _hold(session, candidate)[0]:
            return candidate
    return candidate


@bp.post("/results/<id:result_id>/lease")
def renew_lease(result_id: int):
    """The open review page renews its hold (review.js, every third of the lease); answers who
    else holds it, if someone took it over after it ran out."""
    session = get_db()
    if session.get(Result, result_id) is None:
        abort(404, f"There is no result {result_id}.")
    held = leases.take(session, result_id, current_user.id)
    session.commit()
    if held is not None:
        return jsonify(held=False, holder=held.username, detail=f"{held.username} has this answer open now."), 409
    return jsonify(held=True, lease_s=get_settings().review_lease_s)


@bp.post("/results/<id:result_id>/lease/release")
def release_lease(result_id: int):
    """The page was left (review.js, navigator.sendBeacon): the answer is free for the team."""
    session = get_db()
    leases.release(session, result_id, current_user.id)
    session.commit()
    return "", 204


def _version(name: str = "version") -> int | None:
    raw = request.form.get(name, "")
    return whole_number(raw)


@bp.post("/results/<id:result_id>")
def act(result_id: int):
    session = get_db()
    result = load_for_review(session, result_id)
    if result is None:
        abort(404, f"There is no result {result_id}.")
    action = request.form.get("action", "")
    version, reapplied_from = _version(), _version("reapplied_from")
    schema = output_schema(result)
    fields = draft = None
    text = request.form.get("text")
    message = DONE_MESSAGES.get(action, "")
    try:
        if schema is not None and action in ("edit", "approve") and any(k.startswith("f/") for k in request.form):
            fields = draft = read_form(schema, request.form)
        if action == "approve" and _corrected(result, text, fields):
            # Approve what the reviewer sees in the form: a typed correction is saved first,
            # never dropped (both steps are in the history).
            apply_review(session, result, "edit", current_user.id, text, None, fields=fields, version=version,
                         reapplied_from=reapplied_from)
            version = result.review_version
            message = "Edit saved and approved."
        apply_review(session, result, action, current_user.id, text, request.form.get("note"), fields=fields,
                     version=version, reapplied_from=reapplied_from)
    except StaleReview as exc:
        session.rollback()
        result = _result_or_404(result_id)
        mine, merged = _reapply(result, schema, draft if schema is not None else text, exc.seen)
        return _page(result, str(exc), mine, request.form.get("note", ""), 409, stale=exc, action=action,
                     merged=merged)
    except (ReviewError, FormError) as exc:
        session.rollback()
        return _page(_result_or_404(result_id), str(exc), draft if schema is not None else request.form.get("text"),
                     request.form.get("note", ""), 400)
    session.commit()
    flash(message, "success")
    filters, queue_args = _queue()
    if filters is not None and action in ("approve", "reject", "edit"):
        # The queue moves on to the next result nobody has reviewed or holds, in the list's order.
        leases.release(session, result_id, current_user.id)
        following = _next_free(session, filters, result_id)
        session.commit()
        if following is not None:
            return redirect(url_for("review.result", result_id=following, **queue_args), code=303)
        flash("Nothing left to review in this list.", "info")
        return redirect(url_for("query.index", **filters.as_args()), code=303)
    return redirect(safe_next(request.form.get("next"), url_for("review.result", result_id=result_id)), code=303)


@bp.post("/results/<id:result_id>/gold")
def gold(result_id: int):
    """Mark a reviewed result as gold (held out of training), or return it to training."""
    session = get_db()
    result = load_for_review(session, result_id)
    if result is None:
        abort(404, f"There is no result {result_id}.")
    wanted = request.form.get("gold") == "1"
    seen = _version()
    if seen is not None and seen != result.review_version:
        # Gold holds the answer this page showed, not one reviewed since: look first.
        now = result.review_version
        session.rollback()
        return _page(_result_or_404(result_id), f"This result was reviewed since you opened it (it is at version "
                     f"{now}, your page showed {seen}), so it was not marked. Look at the answer as it is now, "
                     "then mark it again.", status=409)
    try:
        set_gold(result, wanted, current_user.id)
    except GoldError as exc:
        session.rollback()
        return _page(_result_or_404(result_id), str(exc), status=400)
    session.commit()
    flash("Marked as gold: held out of training." if wanted else "Returned to training.", "success")
    _, queue_args = _queue()
    return redirect(url_for("review.result", result_id=result_id, **queue_args), code=303)
