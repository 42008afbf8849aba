"""vidlora.results.confidence: which characters of a JSON answer decide each field, and the
field's confidence from the tokens over them, as the spec."""

import math

import pytest

from vidlora.results.confidence import BANDS, band_of, field_confidence, field_spans

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
