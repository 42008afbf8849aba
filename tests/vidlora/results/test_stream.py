"""vidlora.results.stream: an export's rows read as plain columns are the very rows the ORM
objects give (reviews and their reviewers, notes, field confidences, frames, batch, a running
analysis without a result), in the query's order, for any filter."""

import pytest

from vidlora.db import session_scope
from vidlora.models import Analysis, Review, User
from vidlora.results import stream
from vidlora.results.export import with_provenance
from vidlora.results.query import parse_filters, result_query
from vidlora.results.rows import row_dict

from tests.support.structured import seed_structured

A = {"site": "B", "sealed": False, "finds": [{"material": "jade", "period": "han", "confidence": 0.9}]}
B = {"sealed": True, "finds": [], "damage": ["water"]}


@pytest.fixture(scope="module")
def seeded(database):
    seeded = seed_structured([A, B, A, None], review_states=["approved", "edited", "unreviewed", None],
                             confidences=[{"finds": 0.4, "sealed": 0.9}, None, {"finds": 0.7}, None])
    with session_scope() as session:
        gone = User(username="stream-gone", password_hash="x")  # a reviewer whose account was deleted
        kept = User(username="stream-kept", password_hash="x")
        session.add_all([gone, kept])
        session.flush()
        first, second = seeded.result_ids[:2]
        session.add_all([Review(result_id=first, user_id=kept.id, action="approve", version=1),
                         Review(result_id=first, user_id=None, action="note", note="rim chipped"),
                         Review(result_id=second, user_id=gone.id, action="edit", version=1, note="two finds")])
        # no batch and no frame set: a row of an older analysis
        session.get(Analysis, seeded.analysis_ids[2]).batch_id = None
        session.get(Analysis, seeded.analysis_ids[2]).frame_set_id = None
        session.flush()
        session.delete(gone)
    return seeded


def _orm_rows(session, filters) -> list[dict]:
    stmt = with_provenance(result_query(session, filters))
    return [row_dict(*row) for row in session.execute(stmt)]


def _batch_word(seeded) -> str:
    return seeded.scenario.split("_")[1]  # the batch is "Site B <key>", the scenario "catalogue_<key>"


@pytest.mark.parametrize("args", [{}, {"sort": "uncertain"}, {"q": "clip"}, {"q": "batch"}, {"q": "site"},
                                  {"where": "material=jade"}, {"review_state": "edited"}])
def test_streamed_rows_are_the_rows_of_the_orm_objects(seeded, args):
    if args.get("q") == "batch":
        args = {"q": _batch_word(seeded)}
    filters = parse_filters({"scenario": seeded.scenario, **args})
    with session_scope() as session:
        expected = _orm_rows(session, filters)
        got = list(stream.rows(session, filters, chunk=2))
    assert got == expected and expected
    assert [list(r) for r in got] == [list(r) for r in expected]  # the same columns in the same order


def test_a_search_by_batch_name_finds_rows_of_other_batches_of_the_video(seeded):
    """The batch a row shows is joined under an alias: the search's batch-name match is the
    video's batches, not the analysis's (an analysis without a batch is still found)."""
    filters = parse_filters({"scenario": seeded.scenario, "q": _batch_word(seeded)})
    with session_scope() as session:
        rows = list(stream.rows(session, filters, chunk=500))
    assert len(rows) == 4 and sum(r["batch_name"] is None for r in rows) == 1


def test_reviews_name_their_reviewer_and_the_last_note(seeded):
    with session_scope() as session:
        rows = {r["result_id"]: r for r in stream.rows(session, parse_filters({"scenario": seeded.scenario}), 3)}
    first, second, third = seeded.result_ids
    assert (rows[first]["reviewed_by"], rows[first]["review_note"]) == ("stream-kept", "rim chipped")
    assert (rows[second]["reviewed_by"], rows[second]["review_note"]) == (None, "two finds")
    assert rows[first]["model_field_confidence"] == {"finds": 0.4, "sealed": 0.9}
    assert rows[third]["frame_timestamps"] is None and rows[third]["batch_name"] is None
