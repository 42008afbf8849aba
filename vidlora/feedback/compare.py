"""A candidate adapter version against the stored answers, on the scenario's gold set.

Both are scored against the reviewed answers with the same rules as agreement (exact for
choices and whole numbers, a tolerance for numbers, normalised text): per field, and whole
answers right. Every gold video whose answer the candidate changed is listed side by side
with the stored answer and the reviewed one, so a team reads what the new version does
differently before it serves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from vidlora.feedback.agreement import FieldScore, Rate, score_field
from vidlora.feedback.gold_answers import failure, gold_run
from vidlora.feedback.gold import gold_results
from vidlora.feedback.scores import answer_right, reviewed_answer
from vidlora.models import AdapterRelease, Result, Scenario
from vidlora.results.fields import FieldSpec, in_schema_order, schema_fields
from vidlora.results.rows import iso_utc


@dataclass
class Side:
    """One set of answers on the gold set, scored. ``scored``: gold videos judged (one without
    an answer counts as wrong); ``answered``: those with a usable answer."""

    right: int = 0
    scored: int = 0
    answered: int = 0
    fields: list[FieldScore] = field(default_factory=list)


def _score(side: Side, specs: list[FieldSpec], answer: Any, reviewed: Any, text: str | None, reviewed_text: str,
           relative: float) -> bool:
    side.scored += 1
    for score in side.fields:
        right, compared = score_field(score.spec, answer, reviewed, relative)
        score.right += right
        score.compared += compared
        score.results += compared > 0
    ok = answer_right(specs, answer, reviewed, relative, text, reviewed_text)
    side.right += ok
    return ok


def _reviewed_text(result: Result) -> str:
    return result.edited_text if result.edited_text is not None else result.text


def compare(session: Session, scenario: Scenario, release: AdapterRelease, relative: float) -> dict[str, Any]:
    specs = schema_fields(scenario.output_schema)
    gold = gold_results(session, scenario.id)
    answers = release.gold_answers or {}
    stored, candidate = Side(fields=[FieldScore(s) for s in specs]), Side(fields=[FieldScore(s) for s in specs])
    changed, versions = [], {}
    for result in gold:
        reviewed = reviewed_answer(result.review_state, result.parsed, result.edited_parsed)
        mine = answers.get(str(result.id))
        versions[result.adapter_version or "none"] = versions.get(result.adapter_version or "none", 0) + 1
        old_ok = _score(stored, specs, result.parsed, reviewed, result.text, _reviewed_text(result), relative)
        stored.answered += 1
        if mine is None:
            continue
        why = failure(mine, bool(specs))
        candidate.answered += why is None
        # An error or an invalid answer is no answer: wrong, whatever text came with it.
        new_ok = _score(candidate, specs, mine.get("parsed") if why is None else None, reviewed,
                        mine.get("text") if why is None else None, _reviewed_text(result), relative)
        same = (mine.get("parsed") == result.parsed) if specs else mine.get("text") == result.text
        if not same:
            changed.append({"result_id": result.id, "video": result.analysis.video.original_name,
                            "stored": in_schema_order(result.parsed, scenario.output_schema) if specs else result.text,
                            "candidate": (in_schema_order(mine.get("parsed"), scenario.output_schema) if specs
                                          else mine.get("text")),
                            "reviewed": (in_schema_order(reviewed, scenario.output_schema) if specs
                                         else _reviewed_text(result)),
                            "stored_right": old_ok, "candidate_right": new_ok, "error": mine.get("error"),
                            "why": None if why is None else f"{why[0]}: {why[1]}"})
    return {
        "scenario": scenario.name, "candidate": release.version, "candidate_status": release.status,
        "serving": scenario.adapter_version, "gold": len(gold), "ran_at": iso_utc(release.gold_run_at),
        "candidate_answered": candidate.answered,
        "gold_run": gold_run(release, gold, bool(specs)).as_dict(), "stored_versions": versions,
        "answers_right": {"stored": Rate(stored.right, stored.scored).as_dict(),
                          "candidate": Rate(candidate.right, candidate.scored).as_dict()},
        "fields": [{"field": a.spec.path, "stored": a.as_dict(), "candidate": b.as_dict()}
                   for a, b in zip(stored.fields, candidate.fields)],
        "changed": changed,
    }
