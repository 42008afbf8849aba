"""The health of one stored result, in one shape: built by the GPU worker from the guard's
verdict, completed with the schema check by the analyze task, required by the audit, shown
to reviewers.

Stored as a plain dict in ``Result.health`` (JSON); `ResultHealth.of` reads any stored dict,
including rows written before a field existed (missing fields take their defaults, unknown
keys are kept under ``checks``), so old results stay readable.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

FlagKind = Literal["good", "bad", "info"]


@dataclass(frozen=True)
class Flag:
    name: str
    value: str
    kind: FlagKind


@dataclass(frozen=True)
class ResultHealth:
    ok: bool = False  # the guard judged the output healthy (the audit requires it)
    reason: str | None = None  # why not, in words
    checks: dict[str, Any] = field(default_factory=dict)  # the guard's measurements
    runs: int = 1  # engine runs of this request
    isolated_rerun: bool = False  # the kept output came from a run of the request alone
    recovery: list[str] = field(default_factory=list)  # recovery steps run for its adapter
    recovered_by: str | None = None  # the step after which it came back healthy
    quarantined: bool = False  # refused: its adapter is quarantined
    quality: str | None = None  # the model's own degenerate answer, reproduced: a flag, not a fault
    schema_ok: bool | None = None  # parsed against the scenario's output schema (None: no schema)

    @classmethod
    def of(cls, stored: Mapping[str, Any] | None) -> ResultHealth:
        stored = dict(stored or {})
        names = {f.name for f in fields(cls)}
        known = {k: v for k, v in stored.items() if k in names}
        extra = {k: v for k, v in stored.items() if k not in names}
        if extra:
            known["checks"] = {**extra, **dict(known.get("checks") or {})}
        return cls(**known)

    def with_schema(self, ok: bool | None) -> ResultHealth:
        return replace(self, schema_ok=ok)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> Flag:
        """The verdict in words, first thing a reviewer reads; the flags are the detail."""
        if self.quarantined:
            return Flag("health", f"failed: its adapter is quarantined{f' ({self.reason})' if self.reason else ''}",
                        "bad")
        if not self.ok:
            return Flag("health", f"failed: {self.reason or 'no verdict from the guard'}", "bad")
        if self.schema_ok is False:
            return Flag("health", "does not match the scenario's schema", "bad")
        if self.quality:
            return Flag("health", f"the engine is healthy; the answer itself is {self.quality}", "bad")
        if self.recovered_by:
            return Flag("health", f"healthy after the engine recovered ({self.recovered_by})", "info")
        if self.isolated_rerun:
            return Flag("health", "healthy, re-run alone after a bad batch-mate", "info")
        return Flag("health", "healthy", "good")

    def flags(self) -> list[Flag]:
        """What a reviewer sees, most important first."""
        out = [Flag("guard", "healthy" if self.ok else f"not healthy: {self.reason or 'no verdict'}",
                    "good" if self.ok else "bad")]
        if self.schema_ok is not None:
            out.append(Flag("schema", "matches" if self.schema_ok else "does not match",
                            "good" if self.schema_ok else "bad"))
        if self.quality:
            out.append(Flag("quality", self.quality, "bad"))
        if self.quarantined:
            out.append(Flag("adapter", "quarantined", "bad"))
        if self.runs > 1 or self.isolated_rerun:
            out.append(Flag("engine runs", f"{self.runs}{' (re-run alone)' if self.isolated_rerun else ''}", "info"))
        if self.recovery:
            done = f"; recovered by {self.recovered_by}" if self.recovered_by else ""
            out.append(Flag("recovery", ", ".join(self.recovery) + done, "info"))
        for key, value in sorted(self.checks.items()):
            out.append(_check_flag(key, value))
        return out


def _check_flag(key: str, value: Any) -> Flag:
    label = key.replace("_", " ")
    if value is None:
        return Flag(label, "n/a", "info")
    if isinstance(value, bool):
        # "*_ok" / "*_finite" checks are good when true; other booleans are warnings raised.
        good_when_true = key.endswith(("ok", "finite"))
        return Flag(label, "yes" if value else "no", "good" if value == good_when_true else "bad")
    if isinstance(value, float):
        return Flag(label, f"{value:.3g}", "info")
    if isinstance(value, (list, tuple)):
        return Flag(label, ", ".join(map(str, value[:8])) + (" ..." if len(value) > 8 else ""), "info")
    return Flag(label, str(value), "info")
