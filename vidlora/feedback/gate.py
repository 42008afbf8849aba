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

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from vidlora.feedback.agreement import Rate, wilson
from vidlora.feedback.compare import compare
from vidlora.feedback.gold import gold_results
from vidlora.feedback.gold_answers import GoldRun, gold_run
from vidlora.feedback.releases import ReleaseError, find_release, promote, serving_release
from vidlora.lifecycle import ReleaseStatus
from vidlora.models import AdapterRelease, Result, Scenario


@dataclass
class Verdict:
    """Whether promote serves the candidate; the reasons it refuses, in words."""

    gold_run: GoldRun
    blockers: list[str]  # as the CLI and the API say them: with the command that clears each
    candidate: Rate | None = None
    baseline: Rate | None = None
    baseline_from: str | None = None  # "serving version <v>'s answers" or "the stored answers"
    # The same reasons for the Scenarios page's plain-words view: no names, digests or commands
    # (the page folds those into its technical details).
    in_words: list[str] = field(default_factory=list)

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
        return Verdict(run, blockers, in_words=[
            "there is no gold set to prove it on: mark reviewed results gold (Mark as gold on their review "
            "page), then have it run on the gold set"])
    if not run.ran:
        blockers.append(f"it has not answered the gold set: vidlora eval {scenario.name} --compare "
                        f"{release.version[:12]} --run")
        return Verdict(run, blockers, in_words=["it has not answered the gold set yet"])
    if run.answered < run.gold:
        blockers.append(f"its gold run {run.words()}")
        return Verdict(run, blockers, in_words=list(blockers))
    right = report["answers_right"]["candidate"] if report else None
    candidate = Rate(right["count"], right["of"]) if right else None
    baseline, source = _baseline(session, scenario, serving, gold, relative, report)
    in_words: list[str] = []
    if candidate is not None and baseline is not None and baseline.n and candidate.n:
        # Worse beyond the intervals: the candidate's 95 % interval lies wholly below the
        # baseline's (intervals that overlap are versions the gold set cannot yet tell apart).
        high, low = wilson(candidate.k, candidate.n)[1], wilson(baseline.k, baseline.n)[0]
        if high < low - 1e-12:
            blockers.append(f"its whole answers are right {_pct(candidate)} on the gold set, worse than "
                            f"{source}, {_pct(baseline)}, beyond the 95 % intervals (up to {100 * high:.0f} % "
                            f"against at least {100 * low:.0f} %)")
            in_words.append(blockers[-1].replace(source, "the serving version's answers")
                            if source and source.startswith("serving version") else blockers[-1])
    return Verdict(run, blockers, candidate, baseline, source, in_words)


def _baseline(session: Session, scenario: Scenario, serving: AdapterRelease | None, gold: list[Result],
              relative: float, report: dict[str, Any] | None) -> tuple[Rate | None, str | None]:
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
    report = compare(session, scenario, release, relative) if release.gold_run_at else None
    serving = serving_release(session, scenario)
    serving = serving if serving is not None and serving.id != release.id else None
    return report, verdict(session, scenario, release, report, serving, gold_results(session, scenario.id), relative)


def promote_checked(session: Session, scenario: Scenario, version: str, relative: float,
                    force_reason: str | None = None) -> AdapterRelease:
    """``releases.promote`` once the candidate passes ``check``; ``force_reason``: serve it all
    the same, keeping the reason and what the check said on the release."""
    release = find_release(session, scenario, version)
    if release.status == ReleaseStatus.SERVING:
        raise ReleaseError(f"{scenario.name} already serves {release.version}")
    _, said = check(session, scenario, release, relative)
    reason = (force_reason or "").strip()
    if not said.ok and not reason:
        raise ReleaseError(f"{scenario.name}: not promoting {release.version[:12]}: " + "; ".join(said.blockers)
                           + '. To serve it all the same, add --force --reason "why" (the reason is kept)')
    promoted = promote(session, scenario, release.version)
    promoted.forced_reason = reason if not said.ok else None
    promoted.forced_over = "; ".join(said.blockers) if promoted.forced_reason else None
    session.flush()
    return promoted
