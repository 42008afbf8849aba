"""A candidate's gold run, read: which gold videos it answered, and why not the others.

``tasks.gold_run`` keeps each answer as the engine host returned it (text, parsed, schema
check, error). An error whose words say the engine would not serve the adapter is a
*refusal* (``workers.engine_host``: "adapter ... refused: <reason>"); another error is a
failure; an answer the schema does not accept (or empty text) is no answer; a gold video the
run has no answer for (the set grew since) is missing. None of them counts as an answer.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from vidlora.models import AdapterRelease, Result

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


