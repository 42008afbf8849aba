"""Whether a candidate adapter version may serve, and its gold run told in words.

A version that cannot answer must never serve: ``vidlora scenarios promote`` refuses a
candidate whose gold run (``tasks.gold_run``) has a refusal (the engine's guard would not serve
its adapter), an error, an answer that is no answer (not valid for the schema, or empty), or
fewer answers than the gold set has videos (never run, or run before the set grew); and one
whose whole answers are right less often than the serving version's beyond the intervals the
gold set allows (the candidate's 95 % Wilson interval lies wholly below the serving version's
on the same videos: it is worse, not unlucky; intervals that overlap are, as the Scenarios page
says of agreement, versions not yet told apart). ``--force --reason`` overrides it; the release keeps
the reason (``AdapterRelease.forced_reason``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from vidlora.feedback.agreement import Rate, wilson
from vidlora.models import AdapterRelease, Result, Scenario

# What the engine host's error says when it would not serve the adapter (workers.engine_host).
_REFUSED = (" refused: ", " not served now: ")


def usable(answer: dict[str, Any] | None, structured: bool) -> bool:
    """A gold answer that is an answer: no error, and valid for the schema (or non-empty text)."""
    if not answer or answer.get("error") is not None:
        return False
    if structured:
        return answer.get("parsed") is not None and answer.get("schema_ok") is not False
    return bool((answer.get("text") or "").strip())


def failure(answer: dict[str, Any] | None, structured: bool) -> tuple[str, str] | None:
    """(kind, reason) of a gold answer that is not one; None for a usable answer. kind is
    "refused", "error", "invalid" or "missing"."""
    if answer is None:
        return "missing", "no answer: the gold run did not reach it"
    error = answer.get("error")
    if error is not None:
        for marker in _REFUSED:
            if marker in error:
                return "refused", error.split(marker, 1)[1].strip() or error
        return "error", error
    if usable(answer, structured):
        return None
    if structured:
        return "invalid", "the answer is not valid for the scenario's schema"
    return "invalid", "the answer is empty"


@dataclass
class GoldRun:
    """What a release's gold run produced, on today's gold set."""

    ran: bool
    gold: int
    answered: int = 0
    failures: dict[str, Counter] = field(default_factory=dict)  # kind -> reason -> count

    def count(self, kind: str) -> int:
        return sum(self.failures.get(kind, Counter()).values())

    def words(self) -> str:
        """"answered 0 of 4 gold videos; 4 refused: adapter changes nothing (...)"."""
        if not self.ran:
            return "no gold run"
        parts = [f"answered {self.answered} of {self.gold} gold video{'' if self.gold == 1 else 's'}"]
        for kind, label in (("refused", "refused"), ("error", "failed"), ("invalid", "no valid answer"),
                            ("missing", "not answered")):
            for reason, n in self.failures.get(kind, Counter()).most_common():
                parts.append(f"{n} {label}: {reason}")
        return "; ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {"ran": self.ran, "gold": self.gold, "answered": self.answered,
                **{kind: self.count(kind) for kind in ("refused", "error", "invalid", "missing")},
                "reasons": [{"kind": kind, "reason": reason, "count": n}
                            for kind, reasons in self.failures.items() for reason, n in reasons.most_common()],
                "summary": self.words()}


def gold_run(release: AdapterRelease, gold: list[Result], structured: bool) -> GoldRun:
    answers = release.gold_answers or {}
    out = GoldRun(ran=release.gold_run_at is not None, gold=len(gold))
    if not out.ran:
        return out
    for result in gold:
        why = failure(answers.get(str(result.id)), structured)
        if why is None:
            out.answered += 1
        else:
            out.failures.setdefault(why[0], Counter())[why[1]] += 1
    return out


@dataclass
class Verdict:
    """Whether promote serves the candidate; the reasons it refuses, in words."""

    gold_run: GoldRun
    blockers: list[str]
    candidate: Rate | None = None
    baseline: Rate | None = None
    baseline_from: str | None = None  # "serving version <v>'s answers" or "the stored answers"

    @property
    def ok(self) -> bool:
        return not self.blockers

    def as_dict(self) -> dict[str, Any]:
        return {"promotable": self.ok, "blockers": list(self.blockers), "gold_run": self.gold_run.as_dict(),
                "baseline_from": self.baseline_from,
                "baseline": self.baseline.as_dict() if self.baseline else None}


def verdict(session: Session, scenario: Scenario, release: AdapterRelease, report: dict[str, Any] | None,
            serving: AdapterRelease | None, gold: list[Result], relative: float) -> Verdict:
    """``report``: ``vidlora.feedback.compare.compare`` of the release (None without a gold run);
    ``serving``: the serving release, whose own gold run is the baseline when it answered every
    gold video (else the stored answers on them, what ``eval --compare`` shows beside it)."""
    structured = bool(scenario.output_schema)
    run = gold_run(release, gold, structured)
    blockers: list[str] = []
    if not gold:
        blockers.append(f"{scenario.name} has no gold set to prove it on: mark reviewed results gold "
                        "(Mark as gold, or vidlora gold add RESULT_ID...), then vidlora eval "
                        f"{scenario.name} --compare {release.version[:12]} --run")
        return Verdict(run, blockers)
    if not run.ran:
        blockers.append(f"it has not answered the gold set: vidlora eval {scenario.name} --compare "
                        f"{release.version[:12]} --run")
        return Verdict(run, blockers)
    if run.answered < run.gold:
        blockers.append(f"its gold run {run.words()}")
        return Verdict(run, blockers)
    right = report["answers_right"]["candidate"] if report else None
    candidate = Rate(right["count"], right["of"]) if right else None
    baseline, source = _baseline(session, scenario, serving, gold, relative, report)
    if candidate is not None and baseline is not None and baseline.n and candidate.n:
        # Worse beyond the intervals: the candidate's 95 % interval lies wholly below the
        # baseline's (intervals that overlap are versions the gold set cannot yet tell apart).
        high, low = wilson(candidate.k, candidate.n)[1], wilson(baseline.k, baseline.n)[0]
        if high < low - 1e-12:
            blockers.append(f"its whole answers are right {_pct(candidate)} on the gold set, worse than "
                            f"{source}, {_pct(baseline)}, beyond the 95 % intervals (up to {100 * high:.0f} % "
                            f"against at least {100 * low:.0f} %)")
    return Verdict(run, blockers, candidate, baseline, source)


def _baseline(session: Session, scenario: Scenario, serving: AdapterRelease | None, gold: list[Result],
              relative: float, report: dict[str, Any] | None) -> tuple[Rate | None, str | None]:
    from vidlora.feedback.compare import compare

    structured = bool(scenario.output_schema)
    if serving is not None and serving.gold_run_at is not None and \
            gold_run(serving, gold, structured).answered == len(gold):
        right = compare(session, scenario, serving, relative)["answers_right"]["candidate"]
        return Rate(right["count"], right["of"]), f"serving version {serving.version[:12]}'s answers"
    if report is None:
        return None, None
    right = report["answers_right"]["stored"]
    return Rate(right["count"], right["of"]), "the stored answers"


def _pct(rate: Rate) -> str:
    return f"{100 * rate.value:.0f} % ({rate.k} of {rate.n})"


def check(session: Session, scenario: Scenario, release: AdapterRelease,
          relative: float) -> tuple[dict[str, Any] | None, Verdict]:
    """The release's comparison on the gold set (None before its gold run) and whether
    ``promote`` would serve it: what ``eval --compare``, ``versions``, the Scenarios page and
    ``promote`` itself all read."""
    from vidlora.feedback.compare import compare
    from vidlora.feedback.gold import gold_results
    from vidlora.feedback.releases import serving_release

    report = compare(session, scenario, release, relative) if release.gold_run_at else None
    serving = serving_release(session, scenario)
    serving = serving if serving is not None and serving.id != release.id else None
    return report, verdict(session, scenario, release, report, serving, gold_results(session, scenario.id), relative)
