"""vidlora.attempts: the cap that stops a poison message from looping."""

from dataclasses import dataclass

from vidlora.attempts import begin_attempt


@dataclass
class Row:
    attempts: int = 0
    status: str = "pending"
    reason: str | None = None


def test_each_delivery_counts_until_the_cap_then_fails_with_reason():
    row = Row()
    assert [begin_attempt(row, 3) for _ in range(3)] == [True, True, True]
    assert not begin_attempt(row, 3)
    assert row.status == "failed" and "3 attempts" in row.reason


def test_celery_retries_do_not_count():
    row = Row(attempts=3)
    assert begin_attempt(row, 3, counts=False)
    assert row.attempts == 3
