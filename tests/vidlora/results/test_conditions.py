"""vidlora.results.conditions: what people type becomes a typed condition, or an error that
says what is allowed."""

import pytest

from vidlora.results.conditions import ConditionError, parse_condition, parse_conditions
from vidlora.results.fields import schema_fields

SCHEMA = {"type": "object", "properties": {
    "finds": {"type": "array", "items": {"type": "object", "properties": {
        "material": {"enum": ["bronze", "jade"]},
        "decoration": {"type": "string"},
        "confidence": {"type": "number"}}}},
    "chambers": {"type": "array", "items": {"type": "object", "properties": {"material": {"enum": ["brick"]}}}},
    "chamber_count": {"type": "integer"},
    "sealed": {"type": "boolean"},
}}
FIELDS = schema_fields(SCHEMA)


@pytest.mark.parametrize("raw, path, op, value", [
    ("finds.material=bronze", "finds.material", "=", "bronze"),
    (" confidence >= 0.7 ", "finds.confidence", ">=", 0.7),
    ("chamber_count<3", "chamber_count", "<", 3.0),
    ("decoration~'cloud scroll'", "finds.decoration", "~", "cloud scroll"),
    ("finds.material!=jade", "finds.material", "!=", "jade"),
    ("sealed=TRUE", "sealed", "=", "true"),
])
def test_conditions_are_typed_by_the_schema(raw, path, op, value):
    cond = parse_condition(raw, FIELDS)
    assert (cond.field.path, cond.op, cond.value) == (path, op, value)


@pytest.mark.parametrize("raw, message", [
    ("material=bronze", "could be finds.material, chambers.material"),
    ("colour=red", "no field 'colour'. Its fields: finds.material"),
    ("finds.material=gold", "one of: bronze, jade; not 'gold'"),
    ("confidence>=high", "is a number; 'high' is not a finite number"),
    ("confidence=nan", "'nan' is not a finite number"),
    ("decoration>3", "is not a number"),
    ("sealed=maybe", "is yes/no"),
    ("chamber_count~3", "is a number"),
    ("finds.material=", "give a value"),
    ("just words", "is not a condition"),
])
def test_a_bad_condition_says_what_is_allowed(raw, message):
    with pytest.raises(ConditionError, match=message.replace(".", r"\.").replace("(", r"\(")):
        parse_condition(raw, FIELDS)


def test_conditions_need_a_structured_scenario():
    with pytest.raises(ConditionError, match="choose one first"):
        parse_conditions(["material=bronze"], [])
    assert parse_conditions(["", "  "], []) == []


def test_condition_text_is_normalised_to_its_full_path():
    assert str(parse_condition("confidence>=1", FIELDS)) == "finds.confidence>=1"
    assert str(parse_condition("decoration=a b", FIELDS)) == "finds.decoration=a b"
