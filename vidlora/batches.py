"""Batches: create one, park its files, and record what became of every member.

The CLI, the web upload and the JSON API all come through here: one way to start work.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from sqlalchemy import select
from sqlalchemy.orm import Session

from vidlora.config import Settings
from vidlora.ingest.kinds import numbered
from vidlora.names import canonical
from vidlora.ingest.store import MediaStore, StoredFile, TooLarge
from vidlora.lifecycle import BAD_VIDEO, UNPROBED_VIDEO, AnalysisStatus, BatchStatus, ResumableStatus, UploadStatus
from vidlora.models import Analysis, Batch, BatchItem, ResumableUpload, Scenario, Upload, Video


class BatchError(ValueError):
    """The request to start a batch is wrong (unknown scenario, nothing to ingest)."""


def resolve_scenarios(session: Session, names: list[str]) -> list[Scenario]:
    if not names:
        raise BatchError("choose at least one scenario")
    rows = {s.name: s for s in session.scalars(select(Scenario).where(Scenario.name.in_(names)))}
    unknown = [n for n in names if n not in rows]
    if unknown:
        known = ", ".join(session.scalars(select(Scenario.name).where(Scenario.active)))
        raise BatchError(f"unknown scenario(s): {', '.join(unknown)} (known: {known})")
    inactive = [n for n in names if not rows[n].active]
    if inactive:
        raise BatchError(f"scenario(s) no longer declared: {', '.join(inactive)}")
    return [rows[n] for n in dict.fromkeys(names)]


def create_batch(
    session: Session, name: str, source: str, scenario_names: list[str], created_by: str | None = None
) -> Batch:
    scenarios = resolve_scenarios(session, scenario_names)
    batch = Batch(
        name=canonical(name)[:255], source=source, scenario_names=[s.name for s in scenarios], created_by=created_by
    )
    session.add(batch)
    session.flush()
    return batch


def park_stream(
    session: Session, settings: Settings, batch: Batch, name: str, stream: BinaryIO, max_bytes: int
) -> Upload:
    """Write an incoming upload to the store's upload area, streaming, and register it."""
    assert settings.media_root is not None
    try:
        path = MediaStore(settings.media_root).park_upload(stream, name, max_bytes)
    except TooLarge as exc:
        raise BatchError(f"{name}: larger than the limit of {max_bytes} bytes") from exc
    except ValueError as exc:
        raise BatchError(f"{name}: {exc}") from exc
    upload = Upload(
        batch_id=batch.id, name=name, path=path.relative_to(settings.media_root).as_posix(),
        size_bytes=path.stat().st_size,
    )
    session.add(upload)
    session.flush()
    return upload


def park_received(session: Session, settings: Settings, batch: Batch, row: ResumableUpload) -> Upload:
    """A complete resumable upload joins ``batch`` as a parked upload (its file moved, not
    copied); from here it is ingested like any other."""
    assert settings.media_root is not None
    path = MediaStore(settings.media_root).park_received(settings.media_root / row.path, row.filename)
    upload = Upload(batch_id=batch.id, name=row.filename, path=path.relative_to(settings.media_root).as_posix(),
                    size_bytes=path.stat().st_size)
    session.add(upload)
    row.status, row.batch_id, row.path = ResumableStatus.SUBMITTED, batch.id, upload.path
    session.flush()
    return upload


def park_file(session: Session, settings: Settings, batch: Batch, path: Path, name: str) -> Upload:
    with path.open("rb") as fh:
        return park_stream(session, settings, batch, name, fh, settings.archive_max_total_bytes)


def record_member(
    session: Session,
    batch_id: int,
    name: str,
    status: str,
    reason: str | None,
    stored: StoredFile | None,
    media_root: Path,
) -> tuple[int | None, bool]:
    """Record one member's outcome; for a stored video, register it and its analyses.

    Idempotent: a redelivered ingest task records each member once, and a video already
    known by its content hash is reused, not duplicated. Returns (video_id, needs_prepare).
    Two uploads of one name with different contents are both kept, the second renamed.
    """
    name = requested = canonical(name)
    video = session.scalar(select(Video).where(Video.sha256 == stored.sha256)) if stored is not None else None
    item, name = _item_for(session, batch_id, name, stored is not None, video.id if video else None)
    if stored is not None and video is None:
        video = Video(
            sha256=stored.sha256,
            path=stored.path.relative_to(media_root).as_posix(),
            original_name=Path(name).name[:1024],
            size_bytes=stored.size,
        )
        session.add(video)
        session.flush()
    if item is None:
        if name != requested:
            note = f"renamed: another file of this batch is also named {requested}"
            reason = note if reason is None else f"{reason}; {note}"
        item = BatchItem(batch_id=batch_id, name=name[:1024], status=status, reason=reason)
        item.video_id = video.id if video else None
        session.add(item)
        session.flush()
    if video is None:
        return None, False
    batch = session.get(Batch, batch_id)
    assert batch is not None
    created = ensure_analyses(session, video, batch)
    needs_prepare = video.status in UNPROBED_VIDEO or created > 0
    return video.id, needs_prepare


def _item_for(session: Session, batch_id: int, name: str, stored: bool,
              video_id: int | None) -> tuple[BatchItem | None, str]:
    """The item this member already has (a redelivery), or None and the name to record it by:
    its own, or its first free numbered form when another member of the batch has that name."""
    for n in range(1, 10_000):
        candidate = name if n == 1 else numbered(name, n)
        item = session.scalar(select(BatchItem).where(BatchItem.batch_id == batch_id, BatchItem.name == candidate))
        if item is None:
            return None, candidate
        if (item.video_id is None and not stored) or (video_id is not None and item.video_id == video_id):
            return item, candidate  # this member, recorded before (or a refusal of the same name)
    raise ValueError(f"too many files named {name} in batch {batch_id}")


def ensure_analyses(session: Session, video: Video, batch: Batch) -> int:
    """One analysis per (video, scenario); an existing one (re-upload) is left as it is,
    except that a video already rejected rejects the new scenario's analysis too."""
    scenarios = resolve_scenarios(session, list(batch.scenario_names))
    existing = set(session.scalars(select(Analysis.scenario_id).where(Analysis.video_id == video.id)))
    created = 0
    for scenario in scenarios:
        if scenario.id in existing:
            continue
        analysis = Analysis(video_id=video.id, scenario_id=scenario.id, batch_id=batch.id)
        if video.status in BAD_VIDEO:
            analysis.status, analysis.reason = AnalysisStatus.REJECTED, video.reason
        session.add(analysis)
        created += 1
    session.flush()
    return created


def finish_batch_if_done(session, batch_id: int) -> None:
    # Two uploads of one batch finishing at once each mark their own upload done and would
    # each see the other's as pending (read committed): the batch stayed "ingesting" for
    # ever. The batch row lock serialises them; the second then reads the first's commit.
    batch = session.execute(select(Batch).where(Batch.id == batch_id).with_for_update()
                            .execution_options(populate_existing=True)).scalar_one()
    uploads = session.scalars(select(Upload).where(Upload.batch_id == batch_id)
                              .execution_options(populate_existing=True)).all()
    if any(u.status == UploadStatus.PENDING for u in uploads):
        return
    failed = [u for u in uploads if u.status == UploadStatus.FAILED]
    if failed and len(failed) == len(uploads):
        batch.status, batch.reason = BatchStatus.FAILED, "; ".join(f"{u.name}: {u.reason}" for u in failed)
    else:
        batch.status = BatchStatus.INGESTED
        if failed:
            batch.reason = "; ".join(f"{u.name}: {u.reason}" for u in failed)
