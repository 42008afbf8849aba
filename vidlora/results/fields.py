"""A structured answer as fields: what a scenario's JSON Schema names, and the answer's leaves.

A *field* is a dotted path through the schema's objects, arrays taken implicitly:
``finds.material`` is the material of every item of ``finds``. Each leaf value of an answer
(edited by a reviewer or the model's own) is kept as one ``result_field`` row, so one indexed
table serves equality, ranges, "any find with material = bronze" and facet counts alike on
PostgreSQL and SQLite; ``item`` is the index in the first array on the path, so conditions
on one array can be required to hold for the same item.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from difflib import SequenceMatcher
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete
from sqlalchemy.orm import Session

from vidlora.models import Result, ResultField

# Long strings (a transcription) are indexed by their start: equality and facets are for
# controlled vocabularies and short names; the whole text stays in the result's JSON.
MAX_INDEXED_CHARS = 512
SCALAR_TYPES = ("string", "number", "integer", "boolean")


@dataclass(frozen=True)
class FieldSpec:
    """One leaf of a scenario's schema."""

    path: str
    kind: str  # string | number | integer | boolean
    enum: tuple[Any, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    array: str | None = None  # the first array on the path ("finds"), None for a top-level scalar
    many: bool = False  # a list of scalars (each element is one value of the field)
    description: str = ""

    @property
    def numeric(self) -> bool:
        return self.kind in ("number", "integer")

    @property
    def facetable(self) -> bool:
        """Values a team counts: a controlled vocabulary or a yes/no."""
        return self.enum is not None or self.kind == "boolean"

    @property
    def label(self) -> str:
        return self.path.replace("_", " ").replace(".", " › ")


def resolve_ref(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        return resolve_ref(target, root) if isinstance(target, dict) else {}
    return node


def kind_of(node: dict[str, Any]) -> str | None:
    kind = node.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if kind is None and "enum" in node:
        values = [v for v in node["enum"] if v is not None]
        if values and all(isinstance(v, bool) for v in values):
            return "boolean"
        if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            return "number"
        return "string"
    if kind is None and "properties" in node:
        return "object"
    return kind


def schema_fields(schema: dict[str, Any] | None) -> list[FieldSpec]:
    """Every leaf field of a schema, in the schema's own order."""
    if not schema:
        return []
    out: list[FieldSpec] = []

    def walk(node: dict[str, Any], path: str, array: str | None) -> None:
        node = resolve_ref(node, schema)
        kind = kind_of(node)
        if kind == "object":
            for name, child in (node.get("properties") or {}).items():
                if isinstance(child, dict):
                    walk(child, f"{path}.{name}" if path else name, array)
        elif kind == "array" and isinstance(node.get("items"), dict):
            items = resolve_ref(node["items"], schema)
            if kind_of(items) in SCALAR_TYPES and path:
                out.append(_leaf(items, path, array or path, many=True))
            elif path:
                walk(items, path, array or path)
        elif kind in SCALAR_TYPES and path:
            out.append(_leaf(node, path, array))

    walk(schema, "", None)
    return out


def _leaf(node: dict[str, Any], path: str, array: str | None, many: bool = False) -> FieldSpec:
    enum = tuple(v for v in node["enum"] if v is not None) if isinstance(node.get("enum"), list) else None
    return FieldSpec(path=path, kind=kind_of(node) or "string", enum=enum, minimum=node.get("minimum"),
                     maximum=node.get("maximum"), array=array, many=many,
                     description=str(node.get("description") or ""))


def finite_number(raw: str) -> float | None:
    """A number as people type it, or None: not a number, NaN or infinite."""
    try:
        number = float(raw)
    except ValueError:
        return None
    return None if number != number or number in (float("inf"), float("-inf")) else number


@dataclass(frozen=True)
class Leaf:
    path: str
    item: int | None
    text: str | None
    num: float | None


def leaves(value: Any) -> Iterator[Leaf]:
    """The scalar leaves of an answer, by the same paths as ``schema_fields``."""

    def walk(node: Any, path: str, item: int | None) -> Iterator[Leaf]:
        if isinstance(node, dict):
            for key, child in node.items():
                yield from walk(child, f"{path}.{key}" if path else str(key), item)
        elif isinstance(node, list):
            for index, child in enumerate(node):
                yield from walk(child, path, index if item is None else item)
        elif node is None or not path:
            return
        elif isinstance(node, bool):
            yield Leaf(path, item, "true" if node else "false", None)
        elif isinstance(node, (int, float)):
            yield Leaf(path, item, None, float(node))
        else:
            yield Leaf(path, item, str(node)[:MAX_INDEXED_CHARS], None)

    yield from walk(value, "", None)


def final_value(result: Result) -> Any:
    """The answer as it stands: the reviewer's edit, else the model's."""
    return result.edited_parsed if result.edited_parsed is not None else result.parsed


def index_fields(session: Session, result: Result) -> None:
    """Replace a result's field rows with the leaves of its current answer (after it is
    stored, and after every edit). A free-text result has none."""
    session.flush()  # the result has its id
    session.execute(delete(ResultField).where(ResultField.result_id == result.id))
    value = final_value(result)
    if value is None:
        return
    seen: set[tuple] = set()
    rows = []
    for leaf in leaves(value):
        key = (leaf.path[:255], leaf.text, leaf.num)
        rows.append(ResultField(result_id=result.id, path=key[0], item=leaf.item, text=leaf.text, num=leaf.num,
                                repeat=key in seen))
        seen.add(key)
    session.add_all(rows)


@dataclass(frozen=True)
class FieldChange:
    path: str  # with item positions: "finds[1].material"
    before: Any
    after: Any


def changes(before: Any, after: Any) -> list[FieldChange]:
    """What an edit changed, field by field (an added or removed item shows as its fields
    going from or to nothing; an empty list and no list are the same nothing). Items of a
    list are matched by content, not position: removing chamber 1 of 3 is chamber 1's fields
    going to nothing, not every later chamber's fields moving up one."""
    out: list[FieldChange] = []
    _diff(before, after, "", out)
    return out


def _is_items(value: Any) -> bool:
    return isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value)


def _diff(before: Any, after: Any, path: str, out: list[FieldChange]) -> None:
    nothing = (None, [])
    if isinstance(before, dict) or isinstance(after, dict):
        if not (isinstance(before, dict) or before in nothing) or not (isinstance(after, dict) or after in nothing):
            out.append(FieldChange(path, before, after))  # a value that changed kind: whole
            return
        old, new = before or {}, after or {}
        for key in dict.fromkeys([*old, *new]):
            _diff(old.get(key), new.get(key), f"{path}.{key}" if path else str(key), out)
        return
    if _is_items(before) or _is_items(after):
        if not (isinstance(before, list) or before is None) or not (isinstance(after, list) or after is None):
            out.append(FieldChange(path, before, after))
            return
        _diff_items(before or [], after or [], path, out)
        return
    if before != after and not (before in nothing and after in nothing):
        out.append(FieldChange(path, before, after))


def _diff_items(before: list[Any], after: list[Any], path: str, out: list[FieldChange]) -> None:
    """Items matched by content (the longest common run, as a text diff matches lines): an
    unchanged item is silent wherever it moved; the rest pair up in place, and what is left
    over was removed (named at its old place) or added (at its new one)."""
    keys = [json.dumps(v, sort_keys=True, default=str) for v in before], \
        [json.dumps(v, sort_keys=True, default=str) for v in after]
    for tag, i1, i2, j1, j2 in SequenceMatcher(None, *keys, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        paired = min(i2 - i1, j2 - j1)
        for k in range(paired):
            _diff(before[i1 + k], after[j1 + k], f"{path}[{j1 + k}]", out)
        for i in range(i1 + paired, i2):
            _diff(before[i], None, f"{path}[{i}]", out)
        for j in range(j1 + paired, j2):
            _diff(None, after[j], f"{path}[{j}]", out)


def in_schema_order(value: Any, schema: dict[str, Any] | None, node: dict[str, Any] | None = None) -> Any:
    """An answer with its keys in the schema's order (JSONB keeps its own order), for people
    and exports; keys the schema does not name come last."""
    if schema is None:
        return value
    node = resolve_ref(node if node is not None else schema, schema)
    if isinstance(value, dict):
        props = node.get("properties") or {}
        keys = [k for k in props if k in value] + [k for k in value if k not in props]
        return {k: in_schema_order(value[k], schema, props.get(k) or {}) for k in keys}
    if isinstance(value, list):
        items = node.get("items") if isinstance(node.get("items"), dict) else {}
        return [in_schema_order(v, schema, items) for v in value]
    return value
