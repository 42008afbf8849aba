"""A scenario's adapter versions: register a candidate, promote it to serve, roll back.

scenarios.yaml names the adapter a scenario starts with. Registering a new version makes it a
*candidate*: nothing serves it until it is promoted, after its answers on the scenario's gold
set have been compared with the serving version's (``vidlora eval --compare``). Promoting it
points the scenario at it (new analyses use it; stored results keep the version that made
them); a promotion outlives scenario syncs while scenarios.yaml still names the adapter it
replaced (once the file names another, the file wins: a team's edit is never silently
ignored). ``rollback`` returns to the version the serving one replaced.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from vidlora.lifecycle import AdapterStatus, ReleaseStatus
from vidlora.models import AdapterRelease, Scenario, utcnow
from vidlora.scenarios import adapter_fingerprint, adapter_version


class ReleaseError(ValueError):
    pass


def releases(session: Session, scenario: Scenario) -> list[AdapterRelease]:
    """Newest first."""
    return list(session.scalars(select(AdapterRelease).where(AdapterRelease.scenario_id == scenario.id)
                                .order_by(AdapterRelease.id.desc())))


def serving_release(session: Session, scenario: Scenario) -> AdapterRelease | None:
    """The promoted release the scenario serves, or None while it serves scenarios.yaml's."""
    return session.scalar(select(AdapterRelease).where(AdapterRelease.scenario_id == scenario.id,
                                                       AdapterRelease.status == ReleaseStatus.SERVING))


def find_release(session: Session, scenario: Scenario, version: str) -> AdapterRelease:
    """The release whose version is ``version`` or starts with it (a unique prefix)."""
    found = [r for r in releases(session, scenario) if version and r.version.startswith(version)]
    if len(found) != 1:
        raise ReleaseError(f"{scenario.name} has {'no' if not found else 'more than one'} adapter version "
                           f"{version!r}" + ("; register it first" if not found else "; give more of it"))
    return found[0]


def register_candidate(session: Session, scenario: Scenario, path: Path, note: str | None = None) -> AdapterRelease:
    """Register the adapter at ``path`` as a candidate version of ``scenario``."""
    version = adapter_version(str(path))
    if version is None:
        raise ReleaseError(f"{path} is not an adapter folder")
    if version == scenario.adapter_version:
        raise ReleaseError(f"{scenario.name} already serves adapter version {version}")
    existing = session.scalar(select(AdapterRelease).where(AdapterRelease.scenario_id == scenario.id,
                                                           AdapterRelease.version == version))
    release = existing or AdapterRelease(scenario_id=scenario.id, version=version, status=ReleaseStatus.CANDIDATE)
    release.path, release.note = str(path), note or release.note
    session.add(release)
    session.flush()
    return release


def _current(session: Session, scenario: Scenario) -> AdapterRelease | None:
    """The serving release, recording scenarios.yaml's adapter as one the first time a
    promotion replaces it (so a rollback can return to it)."""
    serving = serving_release(session, scenario)
    if serving is not None or not scenario.adapter_path or not scenario.adapter_version:
        return serving
    baseline = session.scalar(select(AdapterRelease).where(AdapterRelease.scenario_id == scenario.id,
                                                           AdapterRelease.version == scenario.adapter_version))
    baseline = baseline or AdapterRelease(scenario_id=scenario.id, version=scenario.adapter_version,
                                          path=scenario.adapter_path, note="declared in the scenario file")
    baseline.declared_path = scenario.adapter_path
    baseline.status = ReleaseStatus.SERVING
    session.add(baseline)
    session.flush()
    return baseline


def _serve(scenario: Scenario, release: AdapterRelease) -> None:
    scenario.adapter_path, scenario.adapter_version = release.path, release.version
    scenario.adapter_fingerprint = adapter_fingerprint(release.path)
    # Another adapter: the workers judge it anew (engine_patch.registration) on its first request.
    scenario.adapter_status, scenario.adapter_reason, scenario.adapter_digest = AdapterStatus.UNCHECKED, None, None


def promote(session: Session, scenario: Scenario, version: str) -> AdapterRelease:
    """Serve the release (the command checks its gold run first: ``vidlora.feedback.gate``)."""
    release = find_release(session, scenario, version)
    if release.status == ReleaseStatus.SERVING:
        raise ReleaseError(f"{scenario.name} already serves {release.version}")
    current = _current(session, scenario)
    release.declared_path = current.declared_path if current is not None else scenario.adapter_path
    if current is not None:
        current.status = ReleaseStatus.RETIRED
        release.previous_id = current.id
    release.status, release.promoted_at = ReleaseStatus.SERVING, utcnow()
    _serve(scenario, release)
    session.flush()
    return release


def rollback(session: Session, scenario: Scenario) -> AdapterRelease:
    """Serve again the version the serving one replaced."""
    current = serving_release(session, scenario)
    previous = session.get(AdapterRelease, current.previous_id) if current and current.previous_id else None
    if previous is None:
        raise ReleaseError(f"{scenario.name} has no earlier adapter version to return to")
    current.status = ReleaseStatus.RETIRED
    previous.status, previous.promoted_at = ReleaseStatus.SERVING, utcnow()
    _serve(scenario, previous)
    session.flush()
    return previous
