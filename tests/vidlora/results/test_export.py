"""vidlora.results.export: a structured scenario's rows with a column per field (CSV), a row
per array item (items), the typed answer (JSONL) and typed nested columns (Parquet), each
with review state and provenance."""

import csv
import io
import json

import pyarrow.parquet as pq
import pytest

from vidlora.results.export import csv_lines, items_lines, jsonl_lines, write_parquet
from vidlora.results.query import parse_filters

from tests.support.structured import seed_structured

A = {"site": "=cmd|' /C calc'!A0", "sealed": False, "chamber_count": 3,
     "finds": [{"material": "bronze", "period": "han", "confidence": 0.9, "decoration": "cloud scroll"},
               {"material": "jade", "period": "tang", "confidence": 0.4}]}
B = {"sealed": True, "finds": [{"material": "bronze", "period": "tang", "confidence": 0.6}], "damage": ["water"]}


@pytest.fixture(scope="module")
def seeded(database):
    return seed_structured([A, B, None], review_states=["approved", "unreviewed", "unreviewed"])


def _filters(seeded, *where):
    return parse_filters({"scenario": seeded.scenario, "where": list(where)})


def _csv(lines) -> list[dict]:
    return list(csv.DictReader(io.StringIO("".join(lines).lstrip("\ufeff"))))


def test_csv_has_a_column_per_scalar_field_and_arrays_as_json(seeded):
    rows = {r["result_id"]: r for r in _csv(csv_lines(_filters(seeded)))}
    a = rows[str(seeded.result_ids[0])]
    assert a["field.site"] == "'=cmd|' /C calc'!A0"  # a formula never reaches a spreadsheet
    assert (a["field.sealed"], a["field.chamber_count"]) == ("false", "3.0") or a["field.chamber_count"] == "3"
    assert json.loads(a["field.finds"]) == A["finds"]
    assert a["review_state"] == "approved" and a["adapter_version"] == "digest-abc"
    assert json.loads(a["frame_timestamps"]) == [0.5, 1.5] and json.loads(a["engine_versions"])["vllm"] == "0.32.0"
    assert rows[str(seeded.result_ids[1])]["field.damage"] == '["water"]'
    assert len(rows) == 3 and rows[""]["status"] == "running"  # the running analysis is listed, empty


def test_every_csv_cell_is_quoted(seeded):
    first_data_line = "".join(csv_lines(_filters(seeded))).splitlines()[1]
    assert first_data_line.startswith('"') and ',"' in first_data_line and ',,' not in first_data_line


def test_items_give_each_find_its_own_row(seeded):
    rows = _csv(items_lines(_filters(seeded, "material=bronze")))
    finds = [(r["result_id"], r["item"], r["field.finds.material"], r["field.finds.confidence"])
             for r in rows if r["array"] == "finds"]
    a, b = str(seeded.result_ids[0]), str(seeded.result_ids[1])
    assert sorted(finds) == sorted([(a, "0", "bronze", "0.9"), (a, "1", "jade", "0.4"), (b, "0", "bronze", "0.6")])
    assert [(r["result_id"], r["field.damage"]) for r in rows if r["array"] == "damage"] == [(b, "water")]


def test_jsonl_carries_the_typed_answer(seeded):
    rows = [json.loads(line) for line in jsonl_lines(_filters(seeded, "sealed=true"))]
    assert [r["fields"] for r in rows] == [B] and rows[0]["model_fields"] == B


def test_parquet_has_the_answer_as_typed_nested_columns(seeded, tmp_path):
    path = tmp_path / "out.parquet"
    assert write_parquet(_filters(seeded), str(path)) == 3
    table = pq.read_table(path)
    assert str(table.schema.field("fields").type).startswith("struct<site: string, sealed: bool, chamber_count: int64")
    rows = {r["result_id"]: r for r in table.to_pylist()}
    a = rows[seeded.result_ids[0]]
    assert a["fields"]["finds"][0] == {"material": "bronze", "period": "han", "confidence": 0.9,
                                       "decoration": "cloud scroll"}
    assert a["fields"]["chamber_count"] == 3 and a["fields"]["sealed"] is False
    assert json.loads(a["fields_json"]) == A and a["frame_timestamps"] == [0.5, 1.5]
    assert a["review_state"] == "approved" and rows[None]["fields"] is None
    assert json.loads(table.schema.metadata[b"vidlora.output_schema"])["required"] == ["finds", "sealed"]
