"""Reviewing a result: approve, reject, edit, or just note. Shared by the pages and the API.

The model's text in ``Result.text`` is never changed; an edit goes to ``Result.edited_text``
and into an append-only ``Review`` row, so the full history can be shown and audited.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from vidlora.lifecycle import ReviewAction, ReviewState
from vidlora.models import Result, Review

STATE_AFTER = {ReviewAction.APPROVE: ReviewState.APPROVED, ReviewAction.REJECT: ReviewState.REJECTED,
               ReviewAction.EDIT: ReviewState.EDITED}
MAX_TEXT_CHARS = 200_000
MAX_NOTE_CHARS = 10_000


class ReviewError(ValueError):
    pass


def current_text(result: Result) -> str:
    return result.edited_text if result.edited_text is not None else result.text


def _clean(value: str | None) -> str:
    # Browsers send textarea lines as CRLF; store what people typed, not their OS.
    return (value or "").replace("\r\n", "\n").replace("\r", "\n")


def apply_review(session: Session, result: Result, action: str, user_id: int | None,
                 text: str | None = None, note: str | None = None) -> Review:
    note_text = _clean(note).strip() or None
    if note_text and len(note_text) > MAX_NOTE_CHARS:
        raise ReviewError(f"A note may have at most {MAX_NOTE_CHARS} characters.")
    edited: str | None = None
    if action == "edit":
        edited = _clean(text)
        if not edited.strip():
            raise ReviewError("The edited text is empty. To discard a result, reject it instead.")
        if len(edited) > MAX_TEXT_CHARS:
            raise ReviewError(f"The edited text may have at most {MAX_TEXT_CHARS} characters.")
        if edited == current_text(result):
            raise ReviewError("The text is unchanged; nothing to save.")
        result.edited_text = edited
    elif action == "note":
        if not note_text:
            raise ReviewError("Write a note first.")
    elif action not in STATE_AFTER:
        raise ReviewError("Unknown review action; use approve, reject, edit or note.")
    if action in STATE_AFTER:
        result.review_state = STATE_AFTER[action]
    review = Review(user_id=user_id, action=action, text=edited, note=note_text)
    result.reviews.append(review)  # keeps the loaded history current for the response
    session.flush()
    return review


def history(result: Result) -> list[tuple[Review, str | None]]:
    """Each review with the text it replaced (for edits), oldest first."""
    out: list[tuple[Review, str | None]] = []
    before = result.text
    for review in result.reviews:
        if review.action == "edit" and review.text is not None:
            out.append((review, before))
            before = review.text
        else:
            out.append((review, None))
    return out
