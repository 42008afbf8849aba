"""vLLM general-plugin entry point: vLLM calls `register()` in every process it starts
(engine core, workers), so the patches also exist when multiprocessing is on."""
from __future__ import annotations


def register() -> None:
    from . import apply

    apply()
