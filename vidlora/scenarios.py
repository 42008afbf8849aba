"""Scenarios: declared in YAML, validated, synced into the database.

The YAML file is the source of truth; the database copy exists so that every analysis and
result can name the exact prompt and adapter version it ran with.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session

from vidlora.config import Settings
from vidlora.lifecycle import AdapterStatus, ReleaseStatus
from vidlora.media.sampling import SamplingPolicy
from vidlora.models import AdapterRelease, Scenario

@dataclass(frozen=True)
class Generation:
    """A scenario's generation settings: the one definition of their names and defaults."""
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = 0
    repetition_penalty: float = 1.0

    @classmethod
    def of(cls, stored: dict[str, Any] | None) -> "Generation":
        """Typed settings from a scenario row's JSON (missing keys take the defaults)."""
        d = {**DEFAULT_GENERATION, **(stored or {})}
        return cls(max_tokens=int(d["max_tokens"]), temperature=float(d["temperature"]), top_p=float(d["top_p"]),
                   seed=None if d["seed"] is None else int(d["seed"]),
                   repetition_penalty=float(d["repetition_penalty"]))


DEFAULT_GENERATION = asdict(Generation())
GENERATION_KEYS = set(DEFAULT_GENERATION)


class ScenarioError(ValueError):
    pass


@dataclass(frozen=True)
class ScenarioSpec:
    name: str
    title: str
    prompt: str
    adapter_path: str | None
    description: str = ""
    system: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    generation: dict[str, Any] = field(default_factory=dict)
    output_schema: dict[str, Any] | None = None
    latency_target_s: float | None = None  # P95 upload-to-result the team expects (slo.p95_seconds)


def _resolve_adapter(raw: str | None, adapter_root: Path) -> str | None:
    if not raw:
        return None
    path = Path(raw)
    return str(path if path.is_absolute() else adapter_root / path)


def _parse_one(entry: dict[str, Any], adapter_root: Path) -> ScenarioSpec:
    name = str(entry.get("name", "")).strip()
    if not name or not name.replace("_", "").replace("-", "").isalnum() or len(name) > 64:
        raise ScenarioError(f"scenario name {name!r}: use letters, digits, '_' or '-' (max 64)")
    if not entry.get("prompt"):
        raise ScenarioError(f"scenario {name}: prompt is required")
    try:
        policy = SamplingPolicy.from_dict(entry.get("sampling") or {"mode": "uniform"})
    except (TypeError, ValueError) as exc:
        raise ScenarioError(f"scenario {name}: bad sampling policy: {exc}") from exc
    generation = dict(entry.get("generation") or {})
    unknown = set(generation) - GENERATION_KEYS
    if unknown:
        raise ScenarioError(f"scenario {name}: unknown generation keys {sorted(unknown)}")
    generation = {**DEFAULT_GENERATION, **generation}
    if int(generation["max_tokens"]) < 1:
        raise ScenarioError(f"scenario {name}: max_tokens must be >= 1")
    schema = entry.get("output_schema")
    if schema is not None and not isinstance(schema, dict):
        raise ScenarioError(f"scenario {name}: output_schema must be a mapping")
    if schema is not None:
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as exc:
            where = "/".join(str(p) for p in exc.path) or "(top)"
            raise ScenarioError(f"scenario {name}: output_schema is not a valid JSON Schema at {where}: "
                                f"{exc.message}") from None
    slo = entry.get("slo") or {}
    if not isinstance(slo, dict) or set(slo) - {"p95_seconds"}:
        raise ScenarioError(f"scenario {name}: slo takes p95_seconds only")
    target = slo.get("p95_seconds")
    if target is not None and (isinstance(target, bool) or not isinstance(target, (int, float)) or target <= 0):
        raise ScenarioError(f"scenario {name}: slo.p95_seconds must be a positive number of seconds")
    return ScenarioSpec(
        latency_target_s=float(target) if target is not None else None,
        name=name,
        title=str(entry.get("title") or name),
        description=str(entry.get("description") or ""),
        prompt=str(entry["prompt"]).strip(),
        system=(str(entry["system"]).strip() if entry.get("system") else None),
        adapter_path=_resolve_adapter(entry.get("adapter"), adapter_root),
        sampling=policy.as_dict(),
        generation=generation,
        output_schema=schema,
    )


def load_scenarios(path: Path, adapter_root: Path) -> list[ScenarioSpec]:
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ScenarioError(f"cannot read scenario file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ScenarioError(f"scenario file {path} is not valid YAML: {exc}") from exc
    entries = (doc or {}).get("scenarios")
    if not isinstance(entries, list) or not entries:
        raise ScenarioError(f"scenario file {path}: expected a non-empty 'scenarios' list")
    specs = [_parse_one(e, adapter_root) for e in entries]
    names = [s.name for s in specs]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ScenarioError(f"scenario file {path}: duplicate names {sorted(dupes)}")
    return specs


def _adapter_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def adapter_fingerprint(adapter_path: str | None) -> str | None:
    """Hash of the adapter files' names, sizes and mtimes: cheap (stat only), and it changes
    whenever a file is replaced, rewritten or added, so the content hash is redone then."""
    if not adapter_path or not Path(adapter_path).is_dir():
        return None
    root = Path(adapter_path)
    digest = hashlib.sha256()
    for file in _adapter_files(root):
        st = file.stat()
        digest.update(f"{file.relative_to(root).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:32]


def adapter_version(adapter_path: str | None) -> str | None:
    """Content hash of an adapter directory: results name the exact weights they came from."""
    if not adapter_path:
        return None
    root = Path(adapter_path)
    if not root.is_dir():
        return None
    digest = hashlib.sha256()
    for file in _adapter_files(root):
        digest.update(file.relative_to(root).as_posix().encode())
        with file.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def sync_scenarios(session: Session, specs: list[ScenarioSpec]) -> dict[str, int]:
    """Upsert scenarios by name; scenarios no longer declared are deactivated, never deleted
    (their analyses and results must keep pointing at them)."""
    existing = {s.name: s for s in session.scalars(select(Scenario))}
    # A promoted adapter version (vidlora.feedback.releases) serves instead of the declared one
    # while the file still declares what it replaced: an operator's promotion survives the next
    # sync, and a later edit of the file is not ignored.
    promoted = {r.scenario_id: r for r in session.scalars(
        select(AdapterRelease).where(AdapterRelease.status == ReleaseStatus.SERVING))}
    for spec in specs:
        row = existing.get(spec.name) or Scenario(name=spec.name)
        release = promoted.get(row.id)
        if release is not None and release.declared_path == spec.adapter_path:
            spec = replace(spec, adapter_path=release.path)
        elif release is not None:
            release.status = ReleaseStatus.RETIRED
        row.title = spec.title
        row.description = spec.description
        row.prompt = spec.prompt
        row.system_prompt = spec.system
        # A process that cannot see the adapter files (a web container) must not erase the
        # version a GPU worker recorded.
        fingerprint = adapter_fingerprint(spec.adapter_path)
        same_files = (fingerprint is not None and row.adapter_path == spec.adapter_path
                      and row.adapter_fingerprint == fingerprint and row.adapter_version is not None)
        version = row.adapter_version if same_files else adapter_version(spec.adapter_path) or (
            row.adapter_version if row.adapter_path == spec.adapter_path else None
        )
        if not spec.adapter_path:
            row.adapter_status, row.adapter_reason, row.adapter_digest = AdapterStatus.NONE, None, None
        elif (version, spec.adapter_path) != (row.adapter_version, row.adapter_path) or row.adapter_status == AdapterStatus.NONE:
            # Another adapter: the workers' verdict on the old one no longer holds.
            row.adapter_status, row.adapter_reason, row.adapter_digest = AdapterStatus.UNCHECKED, None, None
        row.adapter_version = version
        row.adapter_fingerprint = fingerprint if version is not None else None
        row.adapter_path = spec.adapter_path
        row.sampling = spec.sampling
        row.generation = spec.generation
        row.output_schema = spec.output_schema
        row.latency_target_s = spec.latency_target_s
        row.active = True
        session.add(row)
    declared = {s.name for s in specs}
    for name, row in existing.items():
        if name not in declared:
            row.active = False
    session.flush()
    return {s.name: s.id for s in session.scalars(select(Scenario).where(Scenario.active))}


def sync_from_settings(session: Session, settings: Settings) -> dict[str, int]:
    assert settings.adapter_root is not None
    return sync_scenarios(session, load_scenarios(settings.scenarios_file, settings.adapter_root))


def record_registrations(session: Session, verdicts: dict[str, dict[str, Any]]) -> int:
    """Store GPU workers' registration verdicts (``EngineHost.registrations()``) on the
    scenario rows, so dispatch, status, doctor and the UI see which scenarios are unavailable
    and why. Returns the number of rows changed."""
    changed = 0
    rows = session.scalars(select(Scenario).where(Scenario.name.in_(list(verdicts)))).all()
    for row in rows:
        v = verdicts[row.name]
        if v.get("stage") == "server":
            continue  # the server failed to judge it (its log and doctor say why): no verdict on the adapter
        if not row.adapter_path or str(Path(v["source"]).resolve()) != str(Path(row.adapter_path).resolve()):
            continue  # a verdict on another path (an ad-hoc request, an older declaration)
        status, reason = (AdapterStatus.OK, None) if v["ok"] else (AdapterStatus.REFUSED, str(v["reason"]))
        if (row.adapter_status, row.adapter_reason, row.adapter_digest) != (status, reason, v.get("digest")):
            row.adapter_status, row.adapter_reason, row.adapter_digest = status, reason, v.get("digest")
            changed += 1
    session.flush()
    return changed


def sync() -> dict[str, int]:
    """Sync the configured scenario file into the database; name -> scenario id."""
    from vidlora.config import get_settings
    from vidlora.db import session_scope

    with session_scope() as session:
        return sync_from_settings(session, get_settings())
