"""web.query.downloads: an export is one moment. A download that streams while reviewers
work never pairs a row's review state with a review made after the export began (seen: a
100,050-row CSV with 1,987 rows "unreviewed" beside a reviewer's name)."""

from __future__ import annotations

import csv
import io

import pytest

from tests.support.structured import seed_structured
from vidlora.db import session_scope

ANSWER = {"sealed": True, "site": "B", "finds": [{"material": "ceramic", "period": "unknown", "confidence": 0.5}]}


@pytest.fixture()
def token(reviewer) -> dict[str, str]:
    from web.auth.tokens import create_token
    from web.auth.users import get_user

    with session_scope() as session:
        return {"Authorization": "Bearer " + create_token(session, get_user(session, reviewer), "snap", "review").token}


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_reviews_made_while_an_export_streams_are_not_in_it(client, token, monkeypatch, kind):
    # Small chunks: what 500-row chunks of a 100k export do, in a dozen rows.
    monkeypatch.setattr("vidlora.results.export.CHUNK", 2)
    seeded = seed_structured([ANSWER] * 12)
    download = client.get(f"/api/v1/results/export.{kind}", query_string={"scenario": seeded.scenario},
                          headers=token, buffered=False)
    assert download.status_code == 200
    body = iter(download.response)
    received = [next(body) for _ in range(2 if kind == "csv" else 1)]  # the header and the first row
    for rid in seeded.result_ids:  # a team approves everything while the download runs
        done = client.post(f"/api/v1/results/{rid}/review", headers={**token, "If-Match": '"v0"'},
                           json={"action": "approve"})
        assert done.status_code == 200
    received += list(body)
    text = b"".join(x if isinstance(x, bytes) else x.encode() for x in received).decode()
    if kind == "csv":
        rows = list(csv.DictReader(io.StringIO(text.lstrip("\ufeff"))))
    else:
        import json
        rows = [json.loads(line) for line in text.splitlines()]
    assert len(rows) == 12
    mixed = [(r["review_state"], r["reviewed_by"]) for r in rows if r["review_state"] == "unreviewed" and r["reviewed_by"]]
    assert not mixed, f"{len(mixed)} rows say unreviewed beside a reviewer's name"
    assert {r["review_state"] for r in rows} == {"unreviewed"}  # the moment the export began
