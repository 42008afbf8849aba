"""Result rows as Parquet for data teams: typed columns, the answer as nested typed columns.

The answer's Arrow type is derived from the scenario's JSON Schema (object -> struct,
array -> list, enum/string -> string, integer -> int64, number -> float64, boolean -> bool),
so ``fields.finds`` reads in pandas, DuckDB or Spark as a list of structs. A value that does
not fit its type (a result from before the schema changed) becomes null there; the exact
answer is always kept whole as JSON in ``fields_json``.
"""

from __future__ import annotations

import json
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from vidlora.results.fields import kind_of, resolve_ref
from vidlora.results.rows import COLUMNS

INT_COLUMNS = {"analysis_id", "result_id", "batch_id", "video_id", "video_width", "video_height", "prompt_tokens",
               "output_tokens", "health_engine_runs"}
FLOAT_COLUMNS = {"latency_s", "video_duration_s", "video_declared_duration_s", "model_confidence"}
BOOL_COLUMNS = {"health_ok", "health_schema_ok", "health_isolated_rerun", "video_truncated"}
JSON_COLUMNS = {"engine_versions", "health", "model_field_confidence"}


def arrow_type(node: dict[str, Any] | None, root: dict[str, Any] | None = None) -> pa.DataType:
    root = root if root is not None else node
    node = resolve_ref(node or {}, root or {})
    kind = kind_of(node)
    if kind == "object" and node.get("properties"):
        return pa.struct([pa.field(name, arrow_type(child, root)) for name, child in node["properties"].items()
                          if isinstance(child, dict)])
    if kind == "array" and isinstance(node.get("items"), dict):
        return pa.list_(arrow_type(node["items"], root))
    return {"integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_()}.get(kind or "", pa.string())


def coerce(value: Any, kind: pa.DataType) -> Any:
    """A JSON value shaped to an Arrow type, null where it does not fit."""
    if value is None:
        return None
    if pa.types.is_struct(kind):
        if not isinstance(value, dict):
            return None
        return {kind.field(i).name: coerce(value.get(kind.field(i).name), kind.field(i).type)
                for i in range(kind.num_fields)}
    if pa.types.is_list(kind):
        return [coerce(v, kind.value_type) for v in value] if isinstance(value, list) else None
    if pa.types.is_boolean(kind):
        return value if isinstance(value, bool) else None
    if pa.types.is_integer(kind):
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value == int(value) else None
    if pa.types.is_floating(kind):
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _column_type(name: str) -> pa.DataType:
    if name in INT_COLUMNS:
        return pa.int64()
    if name in FLOAT_COLUMNS:
        return pa.float64()
    if name in BOOL_COLUMNS:
        return pa.bool_()
    if name == "frame_timestamps":
        return pa.list_(pa.float64())
    return pa.string()


class ParquetRows:
    """Writes row dicts (``rows.row_dict``) in row groups as they come."""

    def __init__(self, out: BinaryIO | str, output_schema: dict[str, Any] | None):
        answer = arrow_type(output_schema) if output_schema else pa.string()
        self.answer_type = answer
        self.schema = pa.schema(
            [pa.field(c, _column_type(c)) for c in COLUMNS]
            + [pa.field("fields", answer), pa.field("model_fields", answer), pa.field("fields_json", pa.string())],
            metadata={b"vidlora.output_schema": json.dumps(output_schema).encode()} if output_schema else None,
        )
        self.writer = pq.ParquetWriter(out, self.schema, compression="zstd")
        self.count = 0

    def _value(self, name: str, row: dict[str, Any]) -> Any:
        value = row.get(name)
        if name in JSON_COLUMNS:
            return None if value is None else json.dumps(value, sort_keys=True, ensure_ascii=False)
        if name in ("fields", "model_fields"):
            if pa.types.is_string(self.answer_type):
                return None if value is None else json.dumps(value, ensure_ascii=False)
            return coerce(value, self.answer_type)
        if name == "fields_json":
            return None if row.get("fields") is None else json.dumps(row["fields"], ensure_ascii=False)
        return value

    def write(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        columns = {f.name: pa.array([self._value(f.name, r) for r in rows], type=f.type) for f in self.schema}
        self.writer.write_table(pa.table(columns, schema=self.schema))
        self.count += len(rows)

    def close(self) -> int:
        self.writer.close()
        return self.count
