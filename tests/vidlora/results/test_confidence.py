"""vidlora.results.confidence: which characters of a JSON answer decide each field, and the
field's confidence from the tokens over them, as the spec."""

import math

import pytest

from vidlora.results.confidence import (BANDS, AnswerConfidence, band_of, doubtful, field_confidence, field_spans,
                                       is_part)

ANSWER = ('{"chamber_count":12,"chambers":[{"name":"north","shape":"round"},{"name":"é"}],'
          '"sealed":true,"damage":[],"note":""}')


def _decided(text: str) -> dict[str, list[str]]:
    return {k: [text[a:b] for a, b in ranges] for k, ranges in field_spans(text).items()}


def test_a_fields_decisions_are_its_values_never_its_keys_or_the_structure():
    assert _decided(ANSWER) == {
        "chamber_count": ["12,"],  # the digits and what ended the number
        "chambers": ['north"', 'round"', ",", 'é"', "]"],  # values and closing quotes, how many items
        "sealed": ["true"],
        "damage": ["]"],  # an empty list: choosing no item is its one decision
        "note": ['"'],  # an empty string: its closing quote
    }


def _parts(text: str) -> dict[str, list[str]]:
    found: dict = {}
    field_spans(text, found)
    return {k: [text[a:b] for a, b in ranges] for k, ranges in found.items()}


def test_each_list_item_and_nested_field_has_its_own_decisions_named_as_the_form_names_them():
    """Issue 58: a list's one figure said the list was doubtful, not which item."""
    assert _parts(ANSWER) == {
        "chambers/0": ['north"', 'round"'],  # the first item: its values (the grammar opened it)
        "chambers/0/name": ['north"'],
        "chambers/0/shape": ['round"'],
        "chambers/1": [",", 'é"'],  # a later item: the "," that chose to write it, and its values
        "chambers/1/name": ['é"'],
    }  # the closing "]" (no more chambers) is the list's own decision, in its field's figure
    assert _parts('{"m": ["a", {"k": [1, 2]}], "n": {"o": "p"}}') == {
        "m/0": ['a"'], "m/1": [",", "1,", ",", "2]", "]"], "m/1/k": ["1,", ",", "2]", "]"], "m/1/k/0": ["1,"],
        "m/1/k/1": [",", "2]"], "n/o": ['p"']}


def test_an_items_confidence_is_its_own_least_likely_decision_and_the_list_keeps_the_least():
    text, ends = _tokens('{"finds":[{"m":"', "bronze", '"},{"m":"', "ja", "de", '"}', "]", "}")
    lps = [math.log(p) for p in (0.1, 0.95, 0.8, 0.3, 0.99, 0.97, 0.9, 0.2)]
    conf = field_confidence(text, ends, lps)
    # finds/0: "bronze" 0.95 and its closing quote 0.8, which token 2 writes together with the
    # "," that chose a second item (so it counts for both items); finds/1: "ja" 0.3.
    assert conf.parts == {"finds/0": pytest.approx(0.8), "finds/0/m": pytest.approx(0.8),
                          "finds/1": pytest.approx(0.3), "finds/1/m": pytest.approx(0.3)}
    assert conf.fields == {"finds": pytest.approx(0.3)} and conf.answer == pytest.approx(0.3)
    assert conf.tokens["finds/1/m"] == 3 and conf.tokens["finds"] == 6
    assert AnswerConfidence.of(conf.as_dict()) == conf
    # A worker from before parts were measured sends fields only: read as no parts.
    assert AnswerConfidence.of({"answer": 0.3, "fields": {"finds": 0.3}, "tokens": {"finds": 6}}).parts == {}


def test_a_figure_is_doubtful_below_the_high_band():
    assert [doubtful(x) for x in (0.1, 0.89, 0.9, 1.0, None)] == [True, True, False, False, False]
    assert is_part("finds/0/material") and not is_part("finds")


def test_spaces_between_tokens_are_allowed_and_not_decisions():
    assert _decided('{ "n" : 4 ,\n "m" : [ "a" , "b" ] }') == {"n": ["4 ,"], "m": ['a"', ",", 'b"', "]"]}


@pytest.mark.parametrize("text", ["", "[1, 2]", '"text"', '{"a": 1', '{"a" 1}', "free text {"])
def test_anything_but_one_json_object_has_no_fields(text):
    assert field_spans(text) is None
    assert field_confidence(text, [len(text)], [0.0]) is None


def _tokens(*pieces: str) -> tuple[str, list[int]]:
    ends, at = [], 0
    for p in pieces:
        at += len(p)
        ends.append(at)
    return "".join(pieces), ends


def test_the_field_confidence_is_its_least_likely_decision_token():
    text, ends = _tokens('{"', "material", '":"', "bron", "ze", '","', "count", '":', "3", "}")
    lps = [math.log(p) for p in (0.2, 0.3, 0.1, 0.6, 0.99, 0.5, 0.4, 0.05, 0.9, 0.7)]
    conf = field_confidence(text, ends, lps)
    # material: "bron" 0.6, "ze" 0.99 and '","' 0.5 (its closing quote): the structure tokens at
    # 0.2, 0.3, 0.1 do not count; count: "3" 0.9 and "}" 0.7 (what ended the number)
    assert conf.fields == {"material": pytest.approx(0.5), "count": pytest.approx(0.7)}
    assert conf.answer == pytest.approx(0.5) and conf.tokens == {"material": 3, "count": 2}
    mean = field_confidence(text, ends, lps, method="geomean")
    assert mean.fields["material"] == pytest.approx((0.6 * 0.99 * 0.5) ** (1 / 3), rel=1e-5)
    assert field_confidence(text, ends, lps, method="product").fields["material"] == pytest.approx(0.6 * 0.99 * 0.5)


def test_tokens_that_do_not_cover_the_text_or_a_lost_logprob_give_unknown():
    text, ends = _tokens('{"a":', "1", "}")
    assert field_confidence(text, ends, [0.0, -0.1, -0.2]) is not None
    assert field_confidence(text, ends[:-1], [0.0, -0.1]) is None  # the tokens stop short
    assert field_confidence(text, ends, [0.0, float("nan"), -0.2]) is None
    assert field_confidence(text, ends, [0.0, -0.1]) is None  # one logprob short


def test_bands_cover_zero_to_one_and_unknown():
    assert [band_of(x) for x in (0.0, 0.49, 0.5, 0.89, 0.9, 0.989, 0.99, 1.0, None)] == [
        "low", "low", "medium", "medium", "high", "high", "certain", "certain", "unknown"]
    assert BANDS[0][2] == 0.0 and BANDS[-1][3] > 1.0
