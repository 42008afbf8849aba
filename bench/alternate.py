"""Side by side in one run: each mode once per round, in turn, so the machine's drift (other
work, caches warming) falls on every mode alike, and the ratio is read from one run."""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence


def alternate(modes: Sequence[str], rounds: int, run: Callable[[str, str], dict], key: str) -> tuple[list[dict], dict]:
    """``run(mode, tag)`` per mode per round (``tag`` unique per call); each row printed as it
    comes, with its round. Returns the rows and each mode's mean of ``key``."""
    rows = []
    for r in range(rounds):
        for mode in modes:
            row = dict(run(mode, f"r{r}{mode[:3]}"), round=r + 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    means = {m: round(sum(x[key] for x in rows if x["mode"] == m) / rounds, 3) for m in modes}
    return rows, means
