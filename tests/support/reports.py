"""Tables a test session produced (fault results, the compose stack's timings, the two-host
run), printed at the end of the run by tests/conftest.py so that CI's log shows them even
when every test passes (pytest keeps a passing test's output to itself)."""

from __future__ import annotations

REPORTS: list[tuple[str, str]] = []


def report(title: str, text: str) -> None:
    REPORTS.append((title, text.rstrip()))
