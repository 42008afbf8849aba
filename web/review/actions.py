"""Reviewing a result: approve, reject, edit, or just note. Shared by the pages and the API.

The model's text in ``Result.text`` is never changed; an edit goes to ``Result.edited_text``
and into an append-only ``Review`` row, so the full history can be shown and audited. A
structured result's edit is a value valid against its scenario's schema: kept as data in
``Result.edited_parsed`` (its fields re-indexed for queries) and as compact JSON text.

Reviewers work at the same time, so every approve, reject and edit moves
``Result.review_version`` on and names the version it was made against: a stale one raises
``StaleReview`` (what changed since, so the reviewer can look and re-apply) instead of undoing
another reviewer's work. A note is never stale and moves nothing: it overwrites nothing. Callers load the result
``FOR UPDATE`` (``load_for_review``), so two requests cannot both pass the check.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
from sqlalchemy.orm import Session, selectinload

from vidlora.lifecycle import ReviewAction, ReviewState
from vidlora.models import Analysis, Result, Review
from vidlora.results.fields import final_value, index_fields
from web import json_input

STATE_AFTER = {ReviewAction.APPROVE: ReviewState.APPROVED, ReviewAction.REJECT: ReviewState.REJECTED,
               ReviewAction.EDIT: ReviewState.EDITED}
MAX_TEXT_CHARS = 200_000
MAX_NOTE_CHARS = 10_000


class ReviewError(ValueError):
    pass


class VersionMissing(ReviewError):
    """A save, approve or reject that does not say which version it was made against."""


class StaleReview(ReviewError):
    """The result moved on since the reviewer read it: ``since`` are the reviews made after
    ``seen`` (oldest first), ``current`` is the version to re-apply against."""

    def __init__(self, result: Result, seen: int):
        self.seen, self.current = seen, result.review_version
        self.since = [r for r in result.reviews if r.version is not None and r.version > seen]
        who = sorted({r.user.username if r.user else "unknown user" for r in self.since})
        super().__init__(
            f"{', '.join(who) or 'Someone'} changed this result since you opened it "
            f"({len(self.since)} review{'s' if len(self.since) != 1 else ''}). Nothing of yours was saved: "
            "look at their change, then apply yours again.")


def load_for_review(session: Session, result_id: int) -> Result | None:
    """The result with what a review reads, its row locked until the transaction ends: a
    concurrent review of the same result waits, then sees the version this one made."""
    return session.get(Result, result_id, with_for_update=True, populate_existing=True, options=[
        selectinload(Result.reviews).selectinload(Review.user),
        selectinload(Result.analysis).selectinload(Analysis.video),
        selectinload(Result.analysis).selectinload(Analysis.scenario),
        selectinload(Result.analysis).selectinload(Analysis.frame_set),
    ])


def check_version(result: Result, action: str, version: int | None) -> None:
    if action == "note":
        return
    if version is None:
        raise VersionMissing("Say which version of the result this review was made against "
                             "(the page's form does; the API takes the result's ETag in If-Match).")
    if version != result.review_version:
        raise StaleReview(result, version)


def current_text(result: Result) -> str:
    return result.edited_text if result.edited_text is not None else result.text


def output_schema(result: Result) -> dict[str, Any] | None:
    """The schema a result's edits must follow: its scenario's, where the model's answer was
    structured (a free-text result of a scenario that later gained a schema stays text)."""
    if result.parsed is None:
        return None
    return result.analysis.scenario.output_schema


def as_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _structured_edit(result: Result, schema: dict[str, Any], text: str | None, fields: Any) -> str:
    if fields is None:
        try:
            fields = json_input.loads(_clean(text))
        except ValueError as exc:
            raise ReviewError(f"This result is structured: send its fields (or JSON text). Not JSON: {exc}.") from None
    try:
        json_input.check_value(fields)
    except ValueError as exc:
        raise ReviewError(f"The edit is not an answer: {exc}.") from None
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(fields), key=lambda e: list(e.path))
    if errors:
        raise ReviewError("The edit does not fit the scenario's schema: " + "; ".join(
            f"{'.'.join(str(p) for p in e.path) or 'the answer'}: {e.message}" for e in errors[:5]) + ".")
    if fields == final_value(result):
        raise ReviewError("No field changed; nothing to save.")
    edited = as_text(fields)
    if len(edited) > MAX_TEXT_CHARS:
        raise ReviewError(f"The edited answer may have at most {MAX_TEXT_CHARS} characters.")
    result.edited_parsed = fields
    return edited


def _clean(value: str | None) -> str:
    # Browsers send textarea lines as CRLF; store what people typed, not their OS.
    return (value or "").replace("\r\n", "\n").replace("\r", "\n")


def apply_review(session: Session, result: Result, action: str, user_id: int | None,
                 text: str | None = None, note: str | None = None, fields: Any = None,
                 version: int | None = None, reapplied_from: int | None = None) -> Review:
    """``fields``: a structured result's edited answer as data (the form's or the API's);
    ``text`` may carry it as JSON instead. ``version``: the review version the reviewer saw
    (required but for a note). ``reapplied_from``: sent again from the conflict page, the version
    the first, refused attempt was made against (the history says so)."""
    if action != "note" and action not in STATE_AFTER:
        raise ReviewError("Unknown review action; use approve, reject, edit or note.")
    check_version(result, action, version)
    # The limit is on what was sent (as the API document says), not on what is left after
    # trimming: a note padded with blanks is refused for every action alike.
    if note is not None and len(_clean(note)) > MAX_NOTE_CHARS:
        raise ReviewError(f"A note may have at most {MAX_NOTE_CHARS} characters.")
    note_text = _clean(note).strip() or None
    edited: str | None = None
    schema = output_schema(result)
    if action == "edit" and schema is not None:
        edited = _structured_edit(result, schema, text, fields)
        result.edited_text = edited
        index_fields(session, result)
    elif action == "edit":
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
    if action in STATE_AFTER:
        result.review_state = STATE_AFTER[action]
        result.review_version = (result.review_version or 0) + 1
    # A note changes neither the answer nor its state, so it leaves the version where it is:
    # other reviewers' pending approve, edit or reject stay valid (the note row records the
    # version it was written against).
    review = Review(user_id=user_id, action=action, text=edited, note=note_text, version=result.review_version,
                    reapplied_from=reapplied_from if action != "note" else None)
    result.reviews.append(review)  # keeps the loaded history current for the response
    session.flush()
    return review


def answer_at(result: Result, version: int) -> Any:
    """The answer as it read at review ``version``: text, or a structured result's value."""
    edits = [r for r in result.reviews if r.action == "edit" and r.text is not None
             and (r.version is None or r.version <= version)]  # None: reviewed before versions
    if output_schema(result) is None:
        return edits[-1].text if edits else result.text
    return json.loads(edits[-1].text) if edits else result.parsed


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
