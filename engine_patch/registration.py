"""The one way an adapter reaches the engine: read, normalise, check, identify by content.

The GPU worker's engine host, `verify`, `doctor` and scenario sync all call
`AdapterRegistry.register(name, source)`. It runs `adapters.prepare_adapter` (PEFT's own
arithmetic: key prefixes, split q/k/v, rank/alpha patterns, rsLoRA folded into lora_B; every
module placed on a base weight with checked shapes, rank and finiteness) and returns a
`Registration`: either the normalised adapter vLLM will load, identified by the content
hash of its normalised weights, or a refusal that names the module (or config field) and
why. Nothing else hands an adapter directory to vLLM, so what `verify` proves is what the
worker serves.

The host-side verdict is cached per source directory and file fingerprint (names, sizes,
mtimes), so a re-sync does not re-read twenty large adapters, and an adapter rewritten in
place is read again and gets a new identity. The engine host adds the device-side verdict
(vLLM loads it, it changes the output vs the base model, its canary is healthy) on top.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .adapters import AdapterError, base_modules, prepare_adapter

log = logging.getLogger("engine_patch.registration")


@dataclass(frozen=True, slots=True)
class Registration:
    """The verdict on one adapter. ``ok`` False: ``reason`` says which module and why."""
    name: str
    source: str
    ok: bool
    reason: str | None = None
    digest: str | None = None        # content hash of the normalised weights: the identity
    path: str | None = None          # the normalised adapter directory vLLM loads
    rank: int | None = None
    modules: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    stage: str = "host"              # "host": files checked; "device": engine checks ran too
    checks: dict[str, Any] = field(default_factory=dict)

    def refuse(self, reason: str, stage: str, **checks: Any) -> "Registration":
        return replace(self, ok=False, reason=reason, stage=stage, checks={**self.checks, **checks})

    def as_dict(self) -> dict[str, Any]:
        """Plain values for the heartbeat row, the scenario row and JSON reports."""
        d = asdict(self)
        d["modules"] = len(self.modules)  # the count; the list is in the prepared config
        d["notes"] = list(self.notes)
        return d


def fingerprint(source: Path) -> tuple[tuple[str, int, int], ...] | None:
    """(relative name, size, mtime_ns) of every file: changes when the adapter is rewritten."""
    try:
        files = sorted(p for p in Path(source).rglob("*") if p.is_file())
        return tuple((p.relative_to(source).as_posix(), (st := p.stat()).st_size, st.st_mtime_ns)
                     for p in files)
    except OSError:
        return None


class AdapterRegistry:
    """Host-side registration against one base model (thread-safe; cached by fingerprint)."""

    def __init__(self, model_path: str | Path, max_rank: int, cache_dir: str | Path) -> None:
        self.model_path = Path(model_path)
        self.max_rank = int(max_rank)
        self.cache_dir = Path(cache_dir)
        self._base: dict[str, tuple[int, ...]] | None = None
        self._cache: dict[str, tuple[Any, Registration]] = {}
        self._lock = threading.Lock()

    def base(self) -> dict[str, tuple[int, ...]]:
        if self._base is None:
            self._base = base_modules(self.model_path)
        return self._base

    def register(self, name: str, source: str | Path) -> Registration:
        src = Path(source).resolve() if source else Path("")
        key = str(src)
        with self._lock:
            fp = fingerprint(src)
            hit = self._cache.get(key)
            if hit is not None and fp is not None and hit[0] == fp:
                return replace(hit[1], name=name)
            reg = self._register(name, src)
            if fp is not None:
                self._cache[key] = (fp, reg)
            log.log(logging.INFO if reg.ok else logging.WARNING, "adapter %s (%s): %s", name, src,
                    f"ok, digest {reg.digest}, rank {reg.rank}, {len(reg.modules)} modules"
                    if reg.ok else f"refused: {reg.reason}")
            return reg

    def _register(self, name: str, src: Path) -> Registration:
        blank = Registration(name=name, source=str(src), ok=False)
        if not src.is_dir():
            return blank.refuse(f"adapter directory {src} does not exist", "host")
        if not (src / "adapter_config.json").is_file():
            return blank.refuse(f"{src}: no adapter_config.json (not a PEFT adapter)", "host")
        try:
            prep = prepare_adapter(src, self.model_path, self.max_rank, self.cache_dir, base=self.base())
        except AdapterError as exc:
            return blank.refuse(str(exc), "host")
        except Exception as exc:  # noqa: BLE001 - whatever reading it raises is the adapter's fault
            # Truncated safetensors, malformed JSON, unreadable files.
            return blank.refuse(f"{src}: cannot read the adapter: {type(exc).__name__}: {exc}"[:600], "host")
        return Registration(name=name, source=str(src), ok=True, digest=prep.digest, path=str(prep.path),
                            rank=prep.rank, modules=tuple(prep.modules), notes=tuple(prep.notes))


def registry_for(settings: Any) -> AdapterRegistry:
    """The registry a process builds from vidlora's Settings (model, rank limit, cache dir)."""
    cache = getattr(settings, "adapter_cache_dir", None) or Path(settings.var_dir) / "prepared-adapters"
    return AdapterRegistry(settings.model, int(settings.max_lora_rank), cache)


def main(argv: list[str] | None = None) -> int:
    """python -m engine_patch.registration --model M --max-rank R ADAPTER...: host-side verdicts."""
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(prog="python -m engine_patch.registration")
    ap.add_argument("--model", required=True)
    ap.add_argument("--max-rank", type=int, default=64)
    ap.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "vidlora-prepared"))
    ap.add_argument("adapters", nargs="+")
    a = ap.parse_args(argv)
    reg = AdapterRegistry(a.model, a.max_rank, a.cache_dir)
    verdicts = [reg.register(Path(p).name, p) for p in a.adapters]
    print(json.dumps([v.as_dict() for v in verdicts], indent=1))
    return 0 if all(v.ok for v in verdicts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
