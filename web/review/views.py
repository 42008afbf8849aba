from __future__ import annotations

from flask import abort, flash, redirect, render_template, request, url_for
from flask_login import current_user
from sqlalchemy.orm import selectinload

from vidlora.lifecycle import AnalysisStatus, ReviewState
from vidlora.models import Analysis, Result, Review
from web.database import get_db
from web.review import bp
from web.review.actions import ReviewError, apply_review, current_text, history
from web.review.diff import word_diff
from web.security import safe_next

DONE_MESSAGES = {"approve": "Approved.", "reject": "Rejected.", "edit": "Edit saved.", "note": "Note added."}


def _result_or_404(result_id: int) -> Result:
    result = get_db().get(
        Result, result_id,
        options=[selectinload(Result.reviews).selectinload(Review.user),
                 selectinload(Result.analysis).selectinload(Analysis.video),
                 selectinload(Result.analysis).selectinload(Analysis.scenario)],
    )
    if result is None:
        abort(404, f"There is no result {result_id}.")
    return result


@bp.get("/")
def index():
    """The review queue: finished results nobody has looked at yet."""
    return redirect(url_for("query.index", status=AnalysisStatus.DONE, review_state=ReviewState.UNREVIEWED))


def _page(result: Result, error: str | None = None, draft: str | None = None, note: str = "", status: int = 200):
    entries = [(review, word_diff(before, review.text) if before is not None else None)
               for review, before in history(result)]
    diff = word_diff(result.text, result.edited_text) if result.edited_text is not None else None
    return render_template(
        "review/result.html", result=result, analysis=result.analysis, video=result.analysis.video,
        scenario=result.analysis.scenario, history=entries, diff=diff, error=error,
        draft=current_text(result) if draft is None else draft, note=note,
    ), status


@bp.get("/results/<int:result_id>")
def result(result_id: int):
    return _page(_result_or_404(result_id))


@bp.post("/results/<int:result_id>")
def act(result_id: int):
    session = get_db()
    result = _result_or_404(result_id)
    action = request.form.get("action", "")
    try:
        apply_review(session, result, action, current_user.id, request.form.get("text"), request.form.get("note"))
    except ReviewError as exc:
        session.rollback()
        return _page(_result_or_404(result_id), str(exc), request.form.get("text"),
                     request.form.get("note", ""), 400)
    session.commit()
    flash(DONE_MESSAGES[action], "success")
    return redirect(safe_next(request.form.get("next"), url_for("review.result", result_id=result_id)), code=303)
