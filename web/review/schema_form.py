"""The edit form of a structured result, generated from its scenario's JSON Schema.

``form_tree`` turns the schema and the current answer into a tree of inputs (the template
draws it recursively); ``read_form`` turns the posted form back into a value, which the
review action then validates against the same schema. Inputs are named by their path
(``f/finds/0/material``); each array of objects has its items, a "remove" box per item and
one blank item to add.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from werkzeug.datastructures import MultiDict

from vidlora.digits import signed_whole_number, whole_number
from vidlora.results.fields import finite_number, kind_of, resolve_ref

PREFIX = "f"
NEW = "new"
REMOVE = "__remove"
MAX_ITEMS = 200


class FormError(ValueError):
    pass


@dataclass
class Node:
    kind: str  # object | items | select | multi | number | integer | boolean | text | lines
    name: str
    label: str
    value: Any = None
    options: list[str] = field(default_factory=list)
    children: list[Node] = field(default_factory=list)
    required: bool = False
    minimum: float | None = None
    maximum: float | None = None
    max_length: int | None = None
    removable: bool = False  # an item of an array (its remove box is name + "/__remove")
    blank: bool = False  # the item to add


def _label(key: str) -> str:
    return key.replace("_", " ").capitalize()


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def form_tree(schema: dict[str, Any], value: Any) -> Node:
    return _node(schema, schema, value, PREFIX, "Answer", True)


def _node(node: dict[str, Any], root: dict[str, Any], value: Any, name: str, label: str, required: bool) -> Node:
    node = resolve_ref(node, root)
    kind = kind_of(node)
    if isinstance(node.get("enum"), list) and kind != "array":
        return Node("select", name, label, _text(value), [_text(v) for v in node["enum"]], required=required)
    if kind == "object":
        needed = set(node.get("required") or [])
        value = value if isinstance(value, dict) else {}
        children = [_node(child, root, value.get(key), f"{name}/{key}", _label(key), key in needed)
                    for key, child in (node.get("properties") or {}).items() if isinstance(child, dict)]
        return Node("object", name, label, children=children, required=required)
    if kind == "array":
        items = resolve_ref(node.get("items") or {}, root)
        value = value if isinstance(value, list) else []
        if isinstance(items.get("enum"), list):
            return Node("multi", name, label, [_text(v) for v in value], [_text(v) for v in items["enum"]])
        if kind_of(items) in ("string", "number", "integer"):
            return Node("lines", name, label, "\n".join(_text(v) for v in value))
        children = []
        for index, item in enumerate(value):
            child = _node(items, root, item, f"{name}/{index}", f"{label} {index + 1}", True)
            child.removable = True
            children.append(child)
        if node.get("maxItems") is None or len(value) < int(node["maxItems"]):
            children.append(_blank(_node(items, root, None, f"{name}/{NEW}", f"Add to {label.lower()}", False)))
        return Node("items", name, label, children=children)
    if kind in ("number", "integer"):
        return Node(kind, name, label, _text(value), required=required, minimum=node.get("minimum"),
                    maximum=node.get("maximum"))
    if kind == "boolean":
        return Node("select", name, label, _text(value), ["true", "false"], required=required)
    return Node("text", name, label, "" if value is None else str(value), required=required,
                max_length=node.get("maxLength"))


def _blank(node: Node) -> Node:
    """The item to add: nothing in it is required until someone fills it in."""
    node.blank, node.required = True, False
    for child in node.children:
        _blank(child)
    return node


def as_posted(node: Node) -> MultiDict:
    """What a browser posts for this form untouched: the values as drawn, after the browser's
    own clean-up (a one-line text box drops line breaks). Compared with a real post, it tells
    whether the reviewer changed anything."""
    out = MultiDict()

    def walk(n: Node) -> None:
        if n.kind in ("object", "items"):
            for child in n.children:
                walk(child)
        elif n.kind == "multi":  # one box per choice, posted in the page's order
            for option in n.options:
                if option in n.value:
                    out.add(n.name, option)
        elif n.kind == "text":
            out.add(n.name, n.value.replace("\r", "").replace("\n", ""))
        else:
            out.add(n.name, n.value)

    walk(node)
    return out


class _Missing:
    pass


MISSING = _Missing()


def read_form(schema: dict[str, Any], form) -> Any:
    """The posted form as a value (not yet validated: the review action does that)."""
    value = _read(schema, schema, form, PREFIX, "the answer")
    return {} if value is MISSING else value


def _scalar(items: dict[str, Any], raw: str, label: str) -> Any:
    kind = kind_of(items)
    if isinstance(items.get("enum"), list):
        by_text = {_text(v): v for v in items["enum"]}
        if raw not in by_text:
            raise FormError(f"{label}: '{raw}' is not one of the choices.")
        return by_text[raw]
    if kind == "integer":
        number = signed_whole_number(raw)
        if number is None:
            raise FormError(f"{label} must be a whole number in the digits 0-9; '{raw}' is not.")
        return number
    if kind == "number":
        number = finite_number(raw)
        if number is None:
            raise FormError(f"{label} must be a number; '{raw}' is not.")
        return number
    if kind == "boolean":
        return raw == "true"
    return raw


def _read(node: dict[str, Any], root: dict[str, Any], form, name: str, label: str, required: bool = True) -> Any:
    node = resolve_ref(node, root)
    kind = kind_of(node)
    if kind == "object" and not isinstance(node.get("enum"), list):
        out = {}
        needed = set(node.get("required") or [])
        for key, child in (node.get("properties") or {}).items():
            if isinstance(child, dict):
                value = _read(child, root, form, f"{name}/{key}", key, key in needed)
                if value is not MISSING:
                    out[key] = value
        return out
    if kind == "array":
        values = _read_array(node, root, form, name, label)
        return MISSING if not values and not required else values
    raw = form.get(name)
    # An empty input is an absent value, except a required string, which may be empty.
    if raw is None or (raw.strip() == "" and (kind != "string" or not required)):
        return MISSING
    return _scalar(node, raw.strip() if kind != "string" else raw.replace("\r\n", "\n"), label)


def _read_array(node: dict[str, Any], root: dict[str, Any], form, name: str, label: str) -> list[Any]:
    items = resolve_ref(node.get("items") or {}, root)
    if isinstance(items.get("enum"), list):
        return [_scalar(items, raw, label) for raw in form.getlist(name)]
    if kind_of(items) in ("string", "number", "integer"):
        lines = [line.strip() for line in (form.get(name) or "").splitlines()]
        return [_scalar(items, line, label) for line in lines if line]
    # Only ASCII-digit indices are the form's own rows; anything else ("²") is not a row.
    indices = sorted((number, key) for key in {key[len(name) + 1:].split("/", 1)[0] for key in form.keys()
                                                if key.startswith(name + "/")} - {NEW}
                     if (number := whole_number(key, most_digits=6)) is not None)
    out = []
    for number, index in indices[:MAX_ITEMS]:
        if form.get(f"{name}/{index}/{REMOVE}"):
            continue
        out.append(_read(items, root, form, f"{name}/{index}", f"{label} {number + 1}"))
    added = f"{name}/{NEW}"
    if any(key.startswith(added + "/") and form.get(key) for key in form.keys()):
        out.append(_read(items, root, form, added, f"new {label}"))
    return out
