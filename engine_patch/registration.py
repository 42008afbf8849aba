"""The one way an adapter reaches the engine: read, normalise, check, identify by content.

The GPU worker's engine host, `verify`, `doctor` and scenario sync all call
`AdapterRegistry.register(name, source)`. It runs `adapters.prepare_adapter` (PEFT's own
arithmetic: key prefixes, split q/k/v, rank/alpha patterns, rsLoRA folded into lora_B; every
module placed on a base weight with checked shapes, rank and finiteness) and returns a
`Registration`: either the normalised adapter vLLM will load, identified by the content
hash of its normalised weights and config, or a refusal that names the module (or config field) and
why. Nothing else hands an adapter directory to vLLM, so what `verify` proves is what the
worker serves. On a mixture-of-experts base, `engine_patch.moe` decides first: expert LoRA, and
any LoRA where this vLLM and device have not been shown to serve a MoE model exactly, is
refused with its reason.

The host-side verdict is cached per source directory and file fingerprint (names, sizes,
mtimes), so a re-sync does not re-read twenty large adapters, and an adapter rewritten in
place (weights or config) is read again and gets a new identity: the digest covers the
normalised weights and the whole config. Reasons name files relative to the adapter, never a
server path; links that lead outside the adapter root are refused unless
``adapter_links_outside_root`` allows them. The engine host adds the device-side verdict
(vLLM loads it, it changes the output vs the base model, its canary is healthy) on top.
"""
from __future__ import annotations

import json
import logging
import os
import re
import threading
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from . import moe
from .adapters import AdapterError, ServerFault, base_modules, module_names, prepare_adapter, read_config

log = logging.getLogger("engine_patch.registration")


@dataclass(frozen=True, slots=True)
class Registration:
    """The verdict on one adapter. ``ok`` False: ``reason`` says which module and why."""
    name: str
    source: str
    ok: bool
    reason: str | None = None
    digest: str | None = None        # hash of the normalised weights and config: the identity
    path: str | None = None          # the normalised adapter directory vLLM loads
    rank: int | None = None
    modules: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    # "host": files checked; "device": engine checks ran too; "server": not judged, the server
    # failed (the prepared-adapter cache cannot be written): never cached, never the adapter's verdict
    stage: str = "host"
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


_TERMINAL_CODES = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]|[\x00-\x08\x0b-\x1f\x7f]")


def clean_reason(text: str, *places: Path) -> str:
    """A refusal as shown to users (the Scenarios page, the API, doctor): no server paths (the
    adapter's own files are named relative to it), no terminal codes, bounded."""
    for place in sorted({str(p) for p in places if str(p) not in ("", ".")}, key=len, reverse=True):
        text = text.replace(place + os.sep, "").replace(place, "the adapter directory")
    return _TERMINAL_CODES.sub("", text)[:600]


def outside_link(source: Path, root: Path | None) -> str | None:
    """Why ``source`` reads something outside its adapter root through a symbolic link, or None.

    The root is ``root`` for an adapter under it (the adapter directory itself may then be a
    link within the root), else the adapter directory: a file or folder linked elsewhere would
    let an adapter path read any file of the server."""
    lexical = Path(os.path.abspath(source))
    boundary = lexical
    if root is not None and lexical.is_relative_to(os.path.abspath(root)):
        boundary = Path(os.path.abspath(root))
    fence = boundary.resolve()
    real = lexical.resolve()
    if not real.is_relative_to(fence):
        return "the adapter directory is a link to a place outside the adapter root"
    for folder, dirs, files in os.walk(real):
        for entry in (*dirs, *files):
            path = Path(folder, entry)
            if path.is_symlink() and not path.resolve().is_relative_to(fence):
                shown = path.relative_to(real).as_posix()
                return f"{shown} is a link to a place outside the adapter root"
    return None


class AdapterRegistry:
    """Host-side registration against one base model (thread-safe; cached by fingerprint).

    ``register`` is the host-side verdict, the same for the CLI below, ``vidlora doctor``, scenario
    sync and the GPU worker (which adds its device checks, keyed by the same digest)."""

    def __init__(self, model_path: str | Path, max_rank: int, cache_dir: str | Path,
                 root: str | Path | None = None, links_outside_root: bool = False) -> None:
        self.model_path = Path(model_path)
        self.max_rank = int(max_rank)
        self.cache_dir = Path(cache_dir)
        self.root = Path(root) if root else None
        self.links_outside_root = bool(links_outside_root)
        self._base: dict[str, tuple[int, ...]] | None = None
        self._moe: bool | None = None
        self._cache: dict[str, tuple[Any, Registration]] = {}
        self._lock = threading.Lock()
        self.server_fault: str | None = None  # the last registration's server fault (with its path)

    def base(self) -> dict[str, tuple[int, ...]]:
        if self._base is None:
            try:
                self._base = base_modules(self.model_path)
            except Exception as exc:  # noqa: BLE001 - the served model, not the adapter
                raise ServerFault("the base model cannot be read", self.model_path, exc) from exc
        return self._base

    def register(self, name: str, source: str | Path) -> Registration:
        # Absolute, links not resolved: where the path leads is judged (outside_link), and an
        # adapter is known by the path it was given.
        src = Path(os.path.abspath(source)) if source else Path("")
        key = str(src)
        with self._lock:
            fp = fingerprint(src)
            hit = self._cache.get(key)
            if hit is not None and fp is not None and hit[0] == fp:
                return replace(hit[1], name=name)
            try:
                reg = self._register(name, src)
            except ServerFault as exc:
                # The server's fault: logged with the server's path, judged again at the next
                # registration (so it recovers once the folder is fixed), never cached.
                log.error("adapter %s (%s): not judged, server fault: %s (`vidlora doctor` checks the "
                          "prepared-adapter cache, VIDLORA_ADAPTER_CACHE_DIR)", name, src, exc)
                self.server_fault = str(exc)
                reason = (f"not judged: a server fault, not the adapter's: {exc.what} ({exc.short}); "
                          "see the GPU worker's log and `vidlora doctor`")
                return Registration(name=name, source=str(src), ok=False, stage="server", reason=reason)
            self.server_fault = None
            if fp is not None:
                self._cache[key] = (fp, reg)
            log.log(logging.INFO if reg.ok else logging.WARNING, "adapter %s (%s): %s", name, src,
                    f"ok, digest {reg.digest}, rank {reg.rank}, {len(reg.modules)} modules"
                    if reg.ok else f"refused: {reg.reason}")
            return reg

    def _register(self, name: str, src: Path) -> Registration:
        blank = Registration(name=name, source=str(src), ok=False)
        if not src.is_dir():
            return blank.refuse(f"adapter directory {self._shown(src)} does not exist", "host")
        if not self.links_outside_root:
            why = outside_link(src, self.root)
            if why:
                return blank.refuse(f"{why} (VIDLORA_ADAPTER_LINKS_OUTSIDE_ROOT=1 allows it)", "host")
        real = src.resolve()
        try:
            why = self._moe_refusal(real)
            if why:
                return blank.refuse(clean_reason(why, real, src, self.model_path), "host")
            prep = prepare_adapter(real, self.model_path, self.max_rank, self.cache_dir, base=self.base())
        except AdapterError as exc:
            return blank.refuse(clean_reason(str(exc), real, src, self.model_path), "host")
        except ServerFault:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever else reading it raises is the adapter's fault
            return blank.refuse(clean_reason(f"cannot read the adapter: {type(exc).__name__}: {exc}",
                                             real, src, self.model_path), "host")
        return Registration(name=name, source=str(src), ok=True, digest=prep.digest, path=str(prep.path),
                            rank=prep.rank, modules=tuple(prep.modules), notes=tuple(prep.notes))

    def _moe_refusal(self, real: Path) -> str | None:
        """On a mixture-of-experts base, why the adapter is not served on this vLLM and device
        (engine_patch.moe: expert LoRA and unverified MoE LoRA are refused, never silent)."""
        if self._moe is None:
            try:
                self._moe = moe.is_moe(self.model_path)
            except Exception as exc:  # noqa: BLE001 - the served model's config, not the adapter
                raise ServerFault("the base model cannot be read", self.model_path, exc) from exc
        if not self._moe:
            return None
        return moe.refusal(read_config(real), module_names(real))

    def _shown(self, src: Path) -> str:
        """An adapter path as users see it: relative to the adapter root, else its name."""
        if self.root is not None and src.is_relative_to(os.path.abspath(self.root)):
            return src.relative_to(os.path.abspath(self.root)).as_posix()
        return src.name


def registry_for(settings: Any) -> AdapterRegistry:
    """The registry a process builds from vidlora's Settings (model, rank limit, cache dir,
    adapter root and whether links may leave it)."""
    return AdapterRegistry(settings.model, int(settings.max_lora_rank), cache_dir(settings),
                           root=getattr(settings, "adapter_root", None),
                           links_outside_root=bool(getattr(settings, "adapter_links_outside_root", False)))


def cache_dir(settings: Any) -> Path:
    """Where normalised adapters are written: VIDLORA_ADAPTER_CACHE_DIR, else under the var dir."""
    return Path(getattr(settings, "adapter_cache_dir", None) or Path(settings.var_dir) / "prepared-adapters")


def main(argv: list[str] | None = None) -> int:
    """python -m engine_patch.registration --model M --max-rank R ADAPTER...: host-side verdicts."""
    import argparse

    from vidlora.config import get_settings

    ap = argparse.ArgumentParser(prog="python -m engine_patch.registration")
    ap.add_argument("--model", required=True)
    ap.add_argument("--max-rank", type=int, default=64)
    ap.add_argument("--cache-dir", type=Path, default=None,
                    help="default: VIDLORA_ADAPTER_CACHE_DIR, else VIDLORA_VAR_DIR/prepared-adapters")
    ap.add_argument("adapters", nargs="+")
    a = ap.parse_args(argv)
    reg = AdapterRegistry(a.model, a.max_rank, a.cache_dir or cache_dir(get_settings()))
    verdicts = [reg.register(Path(p).name, p) for p in a.adapters]
    print(json.dumps([v.as_dict() for v in verdicts], indent=1))
    return 0 if all(v.ok for v in verdicts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
