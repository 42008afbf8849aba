"""Calibration per adapter version: does the model's confidence mean what it says?

Each reviewed answer with a confidence (``vidlora.results.confidence``) is one point: the
confidence, and whether the answer was right.

- **Reviews**: the model's answer against the one the review left, by the rule agreement and
  the gold comparison use (``agreement.answer_right``: exact choices, a tolerance for numbers,
  normalised text), so an edit within the number tolerance leaves the answer right, as a gold
  answer within it does; a rejected answer is wrong. Per top-level field: an approved or
  edited answer's field is right when the reviewed answer kept it, by the same rule; a
  rejected answer says nothing about which field was wrong, so its fields are left out.
- **The gold set**: a candidate version's answers on the gold videos (``vidlora eval
  --compare``) against the reviewed gold answers, the same way.

Points fall in equal-width bins of confidence; each bin's accuracy beside its mean confidence
is the reliability table, and the expected calibration error (ECE) is the bins' gap weighted
by their share of points: 0 is a model whose "80 %" is right 80 % of the time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from vidlora.feedback.agreement import answer_right, score_field
from vidlora.feedback.gold import gold_results
from vidlora.feedback.measure import reviewed_answer
from vidlora.lifecycle import ReviewState
from vidlora.models import AdapterRelease, Analysis, Result, ResultConfidence, Scenario
from vidlora.results.fields import FieldSpec, schema_fields

BINS = 10


@dataclass(frozen=True)
class Bin:
    low: float
    high: float
    count: int
    confidence: float  # mean confidence of its points
    accuracy: float  # share of its points that were right

    def as_dict(self) -> dict[str, Any]:
        return {"low": self.low, "high": self.high, "count": self.count,
                "confidence": round(self.confidence, 4), "accuracy": round(self.accuracy, 4),
                "gap": round(self.accuracy - self.confidence, 4)}


@dataclass(frozen=True)
class Reliability:
    count: int
    right: int
    ece: float | None
    bins: list[Bin]

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.count, "right": self.right, "ece": None if self.ece is None else round(self.ece, 4),
                "bins": [b.as_dict() for b in self.bins]}


def reliability(points: Iterable[tuple[float, bool]], bins: int = BINS) -> Reliability:
    """The reliability table (non-empty bins only) and ECE of (confidence, right) points."""
    groups: list[list[tuple[float, bool]]] = [[] for _ in range(bins)]
    for conf, right in points:
        groups[min(int(max(conf, 0.0) * bins), bins - 1)].append((conf, right))
    n = sum(len(g) for g in groups)
    out, ece = [], 0.0
    for i, g in enumerate(groups):
        if not g:
            continue
        conf = sum(c for c, _ in g) / len(g)
        acc = sum(r for _, r in g) / len(g)
        out.append(Bin(i / bins, (i + 1) / bins, len(g), conf, acc))
        ece += len(g) / n * abs(acc - conf)
    return Reliability(n, sum(r for g in groups for _, r in g), ece if n else None, out)


@dataclass
class Calibration:
    version: str | None
    answers: list[tuple[float, bool]] = field(default_factory=list)
    fields: list[tuple[float, bool]] = field(default_factory=list)
    sources: dict[str, int] = field(default_factory=dict)  # answers per source: reviews, gold

    def as_dict(self) -> dict[str, Any]:
        return {"version": self.version, "sources": dict(self.sources),
                "answers": reliability(self.answers).as_dict(), "fields": reliability(self.fields).as_dict()}


def _field_right(specs: list[FieldSpec], name: str, model: Any, reviewed: Any, relative: float) -> bool | None:
    """Whether the reviewed answer kept the model's top-level field ``name``; None: not compared."""
    mine = [s for s in specs if s.path == name or s.path.startswith(name + ".")]
    if not mine:
        return None
    ok, compared = True, 0
    for spec in mine:
        right, n = score_field(spec, model, reviewed, relative)
        compared += n
        ok = ok and right == n
    if compared == 0:  # neither side gives it (an empty list on both): kept as it was
        return (model or {}).get(name) == (reviewed or {}).get(name)
    return ok


def _add(cal: Calibration, source: str, specs: list[FieldSpec], confidence: float, field_conf: dict[str, float],
         model: Any, reviewed: Any, answer_right: bool, relative: float) -> None:
    cal.answers.append((confidence, answer_right))
    cal.sources[source] = cal.sources.get(source, 0) + 1
    if reviewed is None:
        return  # rejected: which field was wrong is not known
    for name, conf in field_conf.items():
        right = _field_right(specs, name, model, reviewed, relative)
        if right is not None:
            cal.fields.append((conf, right))


def scenario_calibration(session: Session, scenario: Scenario, version: str | None = None,
                         relative: float = 0.05) -> list[Calibration]:
    """One ``Calibration`` per adapter version with reviewed answers (or gold answers) that have
    a confidence, the newest version first; ``version`` (or a prefix of it) keeps that one."""
    specs = schema_fields(scenario.output_schema)
    stmt = (select(Result.id, Result.adapter_version, Result.review_state, Result.parsed, Result.edited_parsed,
                   Result.confidence, Result.text, Result.edited_text)
            .join(Analysis, Analysis.id == Result.analysis_id)
            .where(Analysis.scenario_id == scenario.id, Result.confidence.is_not(None),
                   Result.review_state != ReviewState.UNREVIEWED)
            .order_by(Result.id))
    if version:
        stmt = stmt.where(Result.adapter_version.startswith(version, autoescape=True))
    rows = session.execute(stmt).all()
    by_field: dict[int, dict[str, float]] = {}
    ids = [r.id for r in rows]
    for start in range(0, len(ids), 1000):
        for rid, name, conf in session.execute(select(ResultConfidence.result_id, ResultConfidence.field,
                                                      ResultConfidence.confidence)
                                               .where(ResultConfidence.result_id.in_(ids[start:start + 1000]))):
            by_field.setdefault(rid, {})[name] = conf
    out: dict[str | None, Calibration] = {}
    for rid, v, state, parsed, edited, conf, text, edited_text in rows:
        reviewed = reviewed_answer(state, parsed, edited)
        reviewed_text = None if state == ReviewState.REJECTED else (edited_text if edited_text is not None else text)
        right = state != ReviewState.REJECTED and answer_right(specs, parsed, reviewed, relative, text, reviewed_text)
        _add(out.setdefault(v, Calibration(v)), "reviews", specs, conf, by_field.get(rid, {}), parsed, reviewed,
             right, relative)
    _add_gold(session, scenario, specs, version, relative, out)
    return list(reversed(out.values()))  # versions in order of their first point: newest last


def _add_gold(session: Session, scenario: Scenario, specs: list[FieldSpec], version: str | None, relative: float,
              out: dict[str | None, Calibration]) -> None:
    """Candidate versions' answers on the gold set, against the reviewed gold answers."""
    releases = session.scalars(select(AdapterRelease).where(AdapterRelease.scenario_id == scenario.id,
                                                            AdapterRelease.gold_answers.is_not(None))
                               .order_by(AdapterRelease.id)).all()
    if not releases:
        return
    gold = {str(r.id): reviewed_answer(r.review_state, r.parsed, r.edited_parsed)
            for r in gold_results(session, scenario.id)}
    for release in releases:
        if version and not release.version.startswith(version):
            continue
        for rid, answer in (release.gold_answers or {}).items():
            conf = (answer.get("confidence") or {}) if isinstance(answer, dict) else {}
            reviewed = gold.get(rid)
            if conf.get("answer") is None or reviewed is None or answer.get("parsed") is None:
                continue
            fields = {k: float(v) for k, v in (conf.get("fields") or {}).items()}
            right = answer_right(specs, answer["parsed"], reviewed, relative)
            _add(out.setdefault(release.version, Calibration(release.version)), "gold", specs,
                 float(conf["answer"]), fields, answer["parsed"], reviewed, right, relative)
