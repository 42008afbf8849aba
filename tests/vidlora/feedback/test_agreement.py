"""vidlora.feedback.agreement: how reviewers' answers score an adapter version, as the spec."""

import pytest

from tests.support.structured import CATALOGUE
from vidlora.feedback.agreement import agreement, same_value, score_field, values_of, wilson
from vidlora.feedback.scores import reviewed_answer, score
from vidlora.results.fields import FieldSpec, schema_fields

FIELDS = {f.path: f for f in schema_fields(CATALOGUE)}
TOL = 0.05


def test_wilson_interval_matches_the_textbook_values():
    # Wilson (1927) / Newcombe (1998) table: 81 of 263 -> 0.2553-0.3662; 0 of 10 -> 0-0.2775
    low, high = wilson(81, 263)
    assert (round(low, 4), round(high, 4)) == (0.2553, 0.3662)
    low, high = wilson(0, 10)
    assert low == 0.0 and round(high, 4) == 0.2775
    low, high = wilson(10, 10)
    assert high == pytest.approx(1.0) and round(low, 4) == 0.7225
    assert wilson(0, 0) is None


def test_enums_integers_and_yes_no_match_exactly():
    assert same_value(FIELDS["finds.material"], "bronze", "bronze", TOL)
    assert not same_value(FIELDS["finds.material"], "bronze", "jade", TOL)
    assert same_value(FIELDS["chamber_count"], 3, 3, TOL) and not same_value(FIELDS["chamber_count"], 3, 4, TOL)
    assert same_value(FIELDS["sealed"], True, True, TOL)
    assert not same_value(FIELDS["chamber_count"], True, 1, TOL)  # a yes is not the number one


def test_numbers_match_within_the_tolerance_of_their_range():
    confidence = FIELDS["finds.confidence"]  # 0..1: within 0.05
    assert same_value(confidence, 0.80, 0.84, TOL)
    assert not same_value(confidence, 0.80, 0.86, TOL)
    unbounded = FieldSpec("depth_m", "number")  # no range: 5 % of the reviewed value
    assert same_value(unbounded, 10.4, 10.0, TOL) and not same_value(unbounded, 10.6, 10.0, TOL)


def test_strings_match_after_normalising_case_and_blanks():
    decoration = FIELDS["finds.decoration"]
    assert same_value(decoration, "  Incised  Dragon ", "incised dragon", TOL)
    assert same_value(decoration, "ＤＲＡＧＯＮ", "dragon", TOL)  # full-width letters
    assert not same_value(decoration, "incised dragons", "incised dragon", TOL)


def test_a_list_of_choices_is_one_value_in_any_order():
    damage = FIELDS["damage"]
    assert damage.many
    assert same_value(damage, ["water", "looting"], ["looting", "water"], TOL)
    assert not same_value(damage, ["water"], ["water", "looting"], TOL)


def test_array_items_pair_by_position_and_a_missing_or_invented_item_is_wrong():
    model = {"finds": [{"material": "bronze"}, {"material": "jade"}]}
    reviewed = {"finds": [{"material": "bronze"}, {"material": "ceramic"}, {"material": "jade"}]}
    assert values_of(model, FIELDS["finds.material"]) == ["bronze", "jade"]
    assert score_field(FIELDS["finds.material"], model, reviewed, TOL) == (1, 3)
    # a field neither answer gives is not compared
    assert score_field(FIELDS["site"], {"finds": []}, {"finds": []}, TOL) == (0, 0)
    assert score_field(FIELDS["site"], {"site": "B"}, {"site": None}, TOL) == (0, 1)


def test_rates_and_field_accuracy_of_a_version():
    specs = schema_fields(CATALOGUE)
    bronze = {"sealed": True, "finds": [{"material": "bronze", "period": "han", "confidence": 0.8}]}
    jade = {"sealed": True, "finds": [{"material": "jade", "period": "han", "confidence": 0.8}]}
    reviews = [("approved", None), ("approved", None), ("edited", jade), ("rejected", None), ("unreviewed", None)]
    rows = [score(specs, "v1", state, bronze, reviewed_answer(state, bronze, edit), TOL) for state, edit in reviews]
    report = agreement("v1", rows, specs).as_dict()
    assert (report["results"], report["reviewed"], report["unreviewed"]) == (5, 4, 1)
    assert report["approved"]["count"] == 2 and report["approved"]["rate"] == 0.5
    assert report["edited"]["count"] == 1 and report["rejected"]["count"] == 1
    low, high = report["approved"]["ci95"]
    assert 0 < low < 0.5 < high < 1
    by_field = {f["field"]: f for f in report["fields"]}
    # the rejected and the unreviewed result have no reviewed answer: 3 results compared
    assert (by_field["finds.material"]["right"], by_field["finds.material"]["of"]) == (2, 3)
    assert (by_field["finds.period"]["right"], by_field["finds.period"]["of"]) == (3, 3)
    assert by_field["sealed"]["rate"] == 1.0 and by_field["chamber_count"]["of"] == 0
    assert by_field["chamber_count"]["rate"] is None and by_field["chamber_count"]["ci95"] is None


@pytest.mark.parametrize("state", ["approved", "edited", "rejected"])
def test_a_free_text_version_has_rates_only(state):
    report = agreement("v1", [score([], "v1", state, None, None, TOL, text="A bronze mirror.")], []).as_dict()
    assert report[state]["count"] == 1 and report["fields"] == []


@pytest.mark.parametrize("model, reviewed", [
    ({"sealed": True, "chamber_count": 3, "finds": [{"material": "bronze", "period": "han", "confidence": 0.8}]}, None),
    ({"site": " Tomb  B ", "finds": [{"material": "jade", "confidence": "0.8"}, {"period": "tang"}]}, None),  # a number that is not one
    ({"finds": "none", "damage": ["water", "looting"], "chamber_count": True}, None),
    ({"finds": [{"material": "bronze"}, {"material": "jade"}]},
     {"finds": [{"material": "bronze"}, {"material": "ceramic"}, {"material": "jade"}]}),
    ({"sealed": False, "damage": ["water"], "site": "b"}, {"sealed": True, "damage": ["water"], "site": "B"}),
    ({"finds": []}, {"finds": [{"material": "bronze", "confidence": 0.5}]}),
    ("not an answer", {"sealed": True}),
])
def test_scoring_every_field_at_once_gives_each_fields_own_score(model, reviewed):
    """The Scenarios page scores whole answers at once (``score_fields``): the same figures as
    field by field, for an answer approved unchanged (scored against itself) or corrected."""
    from vidlora.feedback.agreement import score_fields

    specs = schema_fields(CATALOGUE)
    reviewed = model if reviewed is None else reviewed
    assert score_fields(specs, model, reviewed, TOL) == tuple(score_field(s, model, reviewed, TOL) for s in specs)
