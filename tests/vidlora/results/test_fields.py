"""vidlora.results.fields: a schema's fields, an answer's leaves by the same paths, and what an
edit changed, field by field."""

from pathlib import Path

from vidlora.results.fields import FieldSpec, changes, leaves, schema_fields
from vidlora.scenarios import load_scenarios

from tests.support.env import ROOT

FINDS = {"type": "object", "properties": {
    "site": {"type": "string"},
    "finds": {"type": "array", "items": {"type": "object", "properties": {
        "material": {"enum": ["bronze", "jade"]},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "tags": {"type": "array", "items": {"type": "string"}}}}},
    "sealed": {"type": "boolean"},
    "damage": {"type": "array", "items": {"enum": ["water", "looting"]}},
}}


def test_fields_are_paths_through_objects_with_arrays_implicit():
    fields = {f.path: f for f in schema_fields(FINDS)}
    assert list(fields) == ["site", "finds.material", "finds.confidence", "finds.tags", "sealed", "damage"]
    assert fields["finds.material"] == FieldSpec("finds.material", "string", enum=("bronze", "jade"), array="finds")
    assert fields["finds.confidence"].numeric and fields["finds.confidence"].maximum == 1
    assert fields["finds.tags"].many and fields["finds.tags"].array == "finds"
    assert fields["damage"].array == "damage" and fields["damage"].facetable
    assert fields["sealed"].kind == "boolean" and fields["sealed"].facetable and fields["sealed"].array is None
    assert not fields["site"].facetable


def test_local_refs_are_followed():
    schema = {"$defs": {"find": {"type": "object", "properties": {"material": {"enum": ["bronze"]}}}},
              "type": "object", "properties": {"finds": {"type": "array", "items": {"$ref": "#/$defs/find"}}}}
    assert [f.path for f in schema_fields(schema)] == ["finds.material"]


def test_every_shipped_scenario_has_fields_and_facets():
    for spec in load_scenarios(ROOT / "scenarios.yaml", Path("/adapters")):
        fields = schema_fields(spec.output_schema)
        assert fields, spec.name
        assert any(f.facetable for f in fields), spec.name


def test_leaves_carry_the_item_of_the_first_array():
    answer = {"site": "B", "sealed": False, "damage": ["water"],
              "finds": [{"material": "bronze", "confidence": 0.9, "tags": ["ding", "han"]},
                        {"material": "jade", "confidence": 1}]}
    got = {(leaf.path, leaf.item, leaf.text, leaf.num) for leaf in leaves(answer)}
    assert got == {("site", None, "B", None), ("sealed", None, "false", None), ("damage", 0, "water", None),
                   ("finds.material", 0, "bronze", None), ("finds.confidence", 0, None, 0.9),
                   ("finds.tags", 0, "ding", None), ("finds.tags", 0, "han", None),
                   ("finds.material", 1, "jade", None), ("finds.confidence", 1, None, 1.0)}


def test_a_long_string_is_indexed_by_its_start():
    [leaf] = leaves({"transcription": "x" * 2000})
    assert len(leaf.text) == 512


def test_changes_name_each_field_that_an_edit_changed():
    before = {"finds": [{"material": "bronze", "confidence": 0.5}], "damage": ["water"]}
    after = {"finds": [{"material": "jade", "confidence": 0.5}, {"material": "bronze", "confidence": 0.2}],
             "damage": ["water", "looting"]}
    assert [(c.path, c.before, c.after) for c in changes(before, after)] == [
        ("finds[0].material", "bronze", "jade"), ("finds[1].material", None, "bronze"),
        ("finds[1].confidence", None, 0.2), ("damage", ["water"], ["water", "looting"])]
    assert changes(before, before) == []


def test_removing_the_first_of_three_items_is_that_item_only():
    """Issue 58: removing chamber 1 of 3 read as 15 changes (every later chamber moved up)."""
    chambers = [{"name": n, "width": w, "length": w + 1, "sealed": False, "finds": 2} for n, w in
                (("north", 3), ("east", 4), ("south", 5))]
    assert [(c.path, c.before, c.after) for c in changes({"chambers": chambers}, {"chambers": chambers[1:]})] == [
        (f"chambers[0].{k}", v, None) for k, v in chambers[0].items()]
    moved = changes({"chambers": chambers}, {"chambers": [chambers[1], {**chambers[2], "width": 6}]})
    assert [(c.path, c.before, c.after) for c in moved] == [
        *((f"chambers[0].{k}", v, None) for k, v in chambers[0].items()), ("chambers[1].width", 5, 6)]


def test_an_empty_list_and_no_list_are_the_same_nothing():
    assert changes({"finds": []}, {"finds": [{"material": "jade"}]}) == [
        type(changes({}, {"a": 1})[0])("finds[0].material", None, "jade")]


def test_answers_are_put_back_in_the_schemas_order():
    from vidlora.results.fields import in_schema_order

    stored = {"sealed": True, "finds": [{"confidence": 1, "material": "jade", "extra": 2}], "site": "B"}
    ordered = in_schema_order(stored, FINDS)
    assert list(ordered) == ["site", "finds", "sealed"]
    assert list(ordered["finds"][0]) == ["material", "confidence", "extra"]
