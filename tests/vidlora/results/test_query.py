"""vidlora.results.query on PostgreSQL: field conditions return exactly the matching results
(any item of an array; one array's conditions on the same item), and facets count per value
for the current filter."""

import pytest

from vidlora.db import session_scope
from vidlora.results.query import FilterError, facets, parse_filters, result_query

from tests.support.structured import seed_structured

A = {"site": "B", "sealed": False, "chamber_count": 3,
     "finds": [{"material": "bronze", "period": "han", "confidence": 0.9, "decoration": "cloud scroll"},
               {"material": "jade", "period": "tang", "confidence": 0.4}]}
B = {"sealed": True, "chamber_count": 1, "finds": [{"material": "bronze", "period": "tang", "confidence": 0.6}],
     "damage": ["water"]}
C = {"sealed": False, "finds": [], "damage": ["looting", "water"]}
E = {"sealed": True, "chamber_count": 5, "finds": [{"material": "ceramic", "period": "han", "confidence": 0.95},
                                                   {"material": "bronze", "period": "unknown", "confidence": 0.2}]}


@pytest.fixture(scope="module")
def seeded(database):
    return seed_structured([A, B, C, None, E])


def _matching(seeded, *where, **extra) -> set[str]:
    names = dict(zip(seeded.analysis_ids, "ABCDE"))
    filters = parse_filters({"scenario": seeded.scenario, "where": list(where), **extra})
    with session_scope() as session:
        rows = session.execute(result_query(session, filters)).all()
        return {names[analysis.id] for analysis, *_ in rows}


@pytest.mark.parametrize("where, expected", [
    ((), "ABCDE"),
    (("material=bronze",), "ABE"),
    (("finds.material=bronze", "period=han"), "A"),  # E has bronze and han, but on different finds
    (("material=bronze", "confidence>=0.5"), "AB"),
    (("confidence>0.9",), "E"),
    (("damage=water",), "BC"),
    (("sealed=true",), "BE"),
    (("chamber_count>=3",), "AE"),
    (("chamber_count<3",), "B"),
    (("decoration~SCROLL",), "A"),
    (("material!=bronze",), "AE"),
    (("sealed=false", "damage=looting"), "C"),
    (("material=ceramic", "damage=water"), ""),
])
def test_field_conditions_select_exactly_the_matching_results(seeded, where, expected):
    assert _matching(seeded, *where) == set(expected)


def test_field_conditions_combine_with_the_other_filters(seeded):
    assert _matching(seeded, "material=bronze", status="done", batch=str(seeded.batch_id)) == set("ABE")
    assert _matching(seeded, "material=bronze", review_state="approved") == set()


def test_a_condition_without_a_structured_scenario_is_refused(seeded):
    with session_scope() as session, pytest.raises(FilterError, match="choose one first"):
        result_query(session, parse_filters({"where": ["material=bronze"]}))
    with session_scope() as session, pytest.raises(FilterError, match="one of: bronze, jade, ceramic"):
        result_query(session, parse_filters({"scenario": seeded.scenario, "where": ["material=gold"]}))


def _counts(seeded, *where) -> dict[str, dict[str, int]]:
    filters = parse_filters({"scenario": seeded.scenario, "where": list(where)})
    with session_scope() as session:
        return {f.field.path: {v.value: v.count for v in f.values} for f in facets(session, filters)}


def test_facets_count_results_per_value(seeded):
    counts = _counts(seeded)
    assert set(counts) == {"sealed", "finds.material", "finds.period", "damage"}
    assert counts["finds.material"] == {"bronze": 3, "jade": 1, "ceramic": 1}
    assert counts["finds.period"] == {"han": 2, "tang": 2, "unknown": 1}
    assert counts["sealed"] == {"true": 2, "false": 2}
    assert counts["damage"] == {"water": 2, "looting": 1, "none": 0}


def test_facets_follow_the_current_filter_and_mark_what_is_chosen(seeded):
    counts = _counts(seeded, "material=bronze")
    assert counts["sealed"] == {"true": 2, "false": 1}
    assert counts["finds.period"] == {"han": 2, "tang": 2, "unknown": 1}  # results, not items: E has a han find
    filters = parse_filters({"scenario": seeded.scenario, "where": ["material=bronze"]})
    with session_scope() as session:
        chosen = [v.condition for f in facets(session, filters) for v in f.values if v.active]
    assert chosen == ["finds.material=bronze"]


def test_a_result_with_a_value_twice_counts_once_for_it(database):
    """Two bronze finds are one result with bronze, before and after an edit re-indexes it."""
    from vidlora.models import Result
    from web.review.actions import apply_review

    bronze = {"material": "bronze", "period": "han", "confidence": 0.5}
    twice = seed_structured([{"sealed": True, "finds": [bronze, bronze, {**bronze, "material": "jade"}]},
                             {"sealed": True, "finds": [bronze]}])
    counts = _counts(twice)
    assert counts["finds.material"] == {"bronze": 2, "jade": 1, "ceramic": 0}
    assert counts["finds.period"] == {"han": 2, "tang": 0, "unknown": 0}
    with session_scope() as session:
        apply_review(session, session.get(Result, twice.result_ids[1]), "edit", None,
                     fields={"sealed": True, "finds": [bronze, {**bronze, "period": "tang"}, bronze]}, version=0)
    counts = _counts(twice)
    assert counts["finds.material"] == {"bronze": 2, "jade": 1, "ceramic": 0}
    assert counts["finds.period"] == {"han": 2, "tang": 1, "unknown": 0}


def test_the_same_conditions_and_facets_on_sqlite(tmp_path):
    """The embedded database (the demo's) answers field queries the same way."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from vidlora.models import Base

    engine = create_engine(f"sqlite:///{tmp_path / 'results.db'}")
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        seeded = seed_structured([A, B, C, None, E], session=session)
        names = dict(zip(seeded.analysis_ids, "ABCDE"))
        for where, expected in ((["material=bronze", "period=han"], "A"), (["confidence>0.9"], "E"),
                                (["damage=water"], "BC"), (["decoration~SCROLL"], "A"), (["sealed=true"], "BE")):
            stmt = result_query(session, parse_filters({"scenario": seeded.scenario, "where": where}))
            assert {names[a.id] for a, *_ in session.execute(stmt)} == set(expected), where
        counts = {f.field.path: {v.value: v.count for v in f.values}
                  for f in facets(session, parse_filters({"scenario": seeded.scenario}))}
        assert counts["finds.material"] == {"bronze": 3, "jade": 1, "ceramic": 1}
    engine.dispose()
