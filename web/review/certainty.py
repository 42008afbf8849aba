"""How sure the model was of each field of an answer, and of each item and nested field inside
it, as the review page lists them: the fields least certain first (where to look), each list's
items in the answer's order under it (so "Chamber 3" is the third chamber the reviewer sees in
the form), the doubtful ones marked.

Stored figures are named by path (``vidlora.results.confidence``): ``finds`` for a field,
``finds/0`` and ``finds/0/material`` for its parts. Answers stored before parts were measured
have fields only, and list as they always did.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from vidlora.results.confidence import SEP, doubtful
from web.template_helpers import field_label

MAX_VALUE_CHARS = 60  # a leaf's value beside its figure: enough to recognise the chamber, not a transcript


@dataclass
class Certainty:
    path: str
    step: str  # the last step of the path: a key, or an item's index
    confidence: float
    value: str | None = None  # a nested leaf's value as the model wrote it, shortened
    children: list[Certainty] = field(default_factory=list)

    parent_step: str = ""

    @property
    def label(self) -> str:
        """Its name under its parent: "Find 2" for an item of finds, "material" for a field."""
        if self.step.isdigit() and self.parent_step:
            return field_label(f"{self.parent_step}{SEP}{self.step}")
        return field_label(self.step)

    @property
    def doubtful(self) -> bool:
        return doubtful(self.confidence)

    @property
    def doubtful_parts(self) -> int:
        """How many of its items (or nested fields) are marked for checking."""
        return sum(c.doubtful for c in self.children)


def _leaf_text(answer: Any, path: str) -> str | None:
    value = answer
    for step in path.split(SEP):
        if isinstance(value, dict):
            value = value.get(step)
        elif isinstance(value, list) and step.isdigit() and int(step) < len(value):
            value = value[int(step)]
        else:
            return None
    if value is None or isinstance(value, (dict, list)):
        return None
    text = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS - 1] + "…"


def certainty_tree(stored: Iterable[Any], answer: Any = None) -> list[Certainty]:
    """The stored figures (rows with ``field`` and ``confidence``, fields before parts and
    parts in the answer's order, as ``tasks.analysis_rows.add_confidence`` stores them) as a
    tree: top-level fields least certain first, each part under its nearest stored parent.
    ``answer``: the model's parsed answer, whose leaf values are shown beside their parts."""
    nodes: dict[str, Certainty] = {}
    top: list[Certainty] = []
    for row in stored:
        path = row.field
        node = Certainty(path, path.rsplit(SEP, 1)[-1], float(row.confidence))
        nodes[path] = node
        parent = path
        while SEP in parent:
            parent = parent.rsplit(SEP, 1)[0]
            if parent in nodes:
                nodes[parent].children.append(node)
                node.parent_step = nodes[parent].step
                node.value = _leaf_text(answer, path)
                break
        else:
            top.append(node)
    for node in nodes.values():
        if node.children:
            node.value = None  # an item or object: its parts carry the values
    return sorted(top, key=lambda n: n.confidence)  # stable: equal figures keep the answer's order
