"""JSON from clients, read so that no input can make the server fail.

Python's ``json`` accepts ``NaN`` and ``Infinity`` (not JSON; PostgreSQL's ``jsonb`` refuses
them, and a bounded number check passes NaN since every comparison with it is false), and it
recurses once per level of nesting: an array ~990 deep ends in RecursionError there or in what
reads the value next (the schema validator, deepcopy). So both are refused at the door, as a
``ValueError`` that the app's JSON provider turns into a 400 like any malformed body.
"""

from __future__ import annotations

import json
import math
from typing import Any

from flask.json.provider import DefaultJSONProvider

# Deeper than any answer schema a scenario has (an answer is an object of lists of objects).
MAX_DEPTH = 32


def _not_a_number(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number; send a finite number")


def depth(value: Any) -> int:
    """Levels of arrays and objects in ``value``, counted without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, level)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((child, level + 1) for child in children)
    return deepest


def check_value(value: Any) -> Any:
    """``value`` itself, if it is shallow enough and all its numbers are finite (a value that
    did not come through ``loads``: the form's, or one built from a patch)."""
    if depth(value) > MAX_DEPTH:
        raise ValueError(f"it is nested more than {MAX_DEPTH} levels deep")
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            raise ValueError(f"{node} is not a JSON number; send a finite number")
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return value


def loads(text: str | bytes) -> Any:
    """``json.loads`` that refuses NaN/Infinity and nesting past ``MAX_DEPTH`` (ValueError)."""
    try:
        value = json.loads(text, parse_constant=_not_a_number)
    except RecursionError:
        raise ValueError(f"it is nested more than {MAX_DEPTH} levels deep") from None
    if depth(value) > MAX_DEPTH:
        raise ValueError(f"it is nested more than {MAX_DEPTH} levels deep")
    return value


class StrictJSONProvider(DefaultJSONProvider):
    """The app's JSON: ``request.get_json`` reads bodies with ``loads`` above."""

    def loads(self, s: str | bytes, **kwargs: Any) -> Any:
        return loads(s)


class BodyError(ValueError):
    """A request body that is not the JSON object an endpoint reads (400, saying which)."""


_KINDS = {list: "a JSON array", str: "a JSON string", bool: "true or false", int: "a number", float: "a number",
          type(None): "null"}


def object_body(request: Any, example: str) -> dict[str, Any]:
    """The request's body as a JSON object, or a BodyError that says what came instead: no
    JSON content type, text that is not JSON (and where), or JSON that is not an object."""
    if not request.is_json:
        sent = request.mimetype or "no Content-Type"
        raise BodyError(f"Send a JSON object such as {example} with Content-Type: application/json "
                        f"(this request came as {sent}).")
    text = request.get_data(as_text=True)
    if not text.strip():
        raise BodyError(f"The body is empty; send a JSON object such as {example}.")
    try:
        value = loads(text)
    except ValueError as exc:
        raise BodyError(f"The body is not JSON ({exc}); send a JSON object such as {example}.") from None
    if not isinstance(value, dict):
        raise BodyError(f"The body is {_KINDS.get(type(value), 'not an object')}, not a JSON object; "
                        f"send a JSON object such as {example}.")
    return value
