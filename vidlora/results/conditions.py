"""Field conditions as people type them: ``material=bronze``, ``finds.confidence>=0.7``.

A condition names a field of the scenario's schema (its full path, or any unique ending of
it: ``material`` for ``finds.material``), an operator and a value, checked against the
field's type and vocabulary so a typo is an error that lists what is allowed, never an
empty page. On an array, a condition holds when any item meets it ("any find with material
= bronze"); conditions on the same array must hold for the same item.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vidlora.results.fields import FieldSpec, finite_number

OPERATORS = ("!=", ">=", "<=", "=", ">", "<", "~")
NUMERIC_ONLY = (">=", "<=", ">", "<")
_PATTERN = re.compile(r"^\s*([A-Za-z0-9_][A-Za-z0-9_.\-]*)\s*(!=|>=|<=|=|>|<|~)\s*(.*?)\s*$", re.S)
MAX_CONDITIONS = 20


class ConditionError(ValueError):
    pass


@dataclass(frozen=True)
class Condition:
    field: FieldSpec
    op: str
    value: str | float  # text for strings, enums and booleans; float for numbers

    def __str__(self) -> str:
        value = self.value
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        return f"{self.field.path}{self.op}{value}"


def _unquote(raw: str) -> str:
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'":
        return raw[1:-1]
    return raw


def find_field(name: str, fields: list[FieldSpec]) -> FieldSpec:
    exact = [f for f in fields if f.path == name]
    if exact:
        return exact[0]
    ending = [f for f in fields if f.path.endswith("." + name)]
    if len(ending) == 1:
        return ending[0]
    if ending:
        raise ConditionError(f"'{name}' could be {', '.join(f.path for f in ending)}: write the full name.")
    known = ", ".join(f.path for f in fields) or "none"
    raise ConditionError(f"This scenario has no field '{name}'. Its fields: {known}.")


def parse_condition(raw: str, fields: list[FieldSpec]) -> Condition:
    match = _PATTERN.match(raw)
    if not match:
        raise ConditionError(f"'{raw}' is not a condition: write field, operator and value, e.g. material=bronze "
                             f"or confidence>=0.7 (operators: {' '.join(OPERATORS)}).")
    name, op, value = match.group(1), match.group(2), _unquote(match.group(3))
    field = find_field(name, fields)
    if value == "":
        raise ConditionError(f"'{raw}': give a value after {op}.")
    if field.numeric:
        if op == "~":
            raise ConditionError(f"{field.path} is a number: use =, !=, >, >=, < or <=.")
        number = finite_number(value)
        if number is None:
            raise ConditionError(f"{field.path} is a number; '{value}' is not a finite number.")
        return Condition(field, op, number)
    if op in NUMERIC_ONLY:
        raise ConditionError(f"{field.path} is not a number: use = or != (or ~ for 'contains').")
    if field.kind == "boolean":
        lowered = value.lower()
        if lowered not in ("true", "false") or op == "~":
            raise ConditionError(f"{field.path} is yes/no: write {field.path}=true or {field.path}=false.")
        return Condition(field, op, lowered)
    if field.enum is not None and op != "~" and value not in [str(v) for v in field.enum]:
        raise ConditionError(f"{field.path} is one of: {', '.join(str(v) for v in field.enum)}; not '{value}'.")
    return Condition(field, op, value)


def parse_conditions(raws: list[str] | tuple[str, ...], fields: list[FieldSpec]) -> list[Condition]:
    raws = [r for r in raws if r.strip()]
    if len(raws) > MAX_CONDITIONS:
        raise ConditionError(f"At most {MAX_CONDITIONS} field conditions at once.")
    if raws and not fields:
        raise ConditionError("Field conditions need a scenario with structured answers: choose one first.")
    return [parse_condition(r, fields) for r in raws]
