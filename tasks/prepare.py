"""Prepare one video: probe it, sample frames once per distinct sampling policy, and mark
its analyses ready for the GPU.

Decoding happens in a killable subprocess (vidlora.media) and this task runs under a hard
time limit in a prefork child, so a file that hangs a decoder costs one attempt, not a worker.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from celery import shared_task
from sqlalchemy import select

from tasks import messages
from tasks.base import VidloraTask
from vidlora import metrics
from vidlora.attempts import begin_attempt
from vidlora.config import get_settings
from vidlora.db import session_scope
from vidlora.ingest.store import MediaStore
from vidlora.lifecycle import BAD_VIDEO, FINAL_ANALYSIS, AnalysisStatus, FrameSetStatus, VideoStatus
from vidlora.locks import try_lock
from vidlora.media.ffprobe import FrameTable
from vidlora.media.frames import FrameReuse, frame_table, sample_video
from vidlora.media.probe import BadVideo, ProbeInfo, probe_with_table
from vidlora.media.sampling import SamplingPolicy
from vidlora.models import Analysis, FrameSet, Scenario, Video, utcnow

log = logging.getLogger(__name__)

PROBE_FIELDS = ("container", "codec", "width", "height", "rotation", "fps", "duration_s", "frame_count",
                "field_order", "declared_duration_s", "truncated")


def _close_analyses(session, video_id: int, status: str, reason: str, scenario_ids=None) -> None:
    query = select(Analysis).where(
        Analysis.video_id == video_id, Analysis.status.not_in(FINAL_ANALYSIS)
    )
    if scenario_ids is not None:
        query = query.where(Analysis.scenario_id.in_(scenario_ids))
    for analysis in session.scalars(query):
        analysis.status, analysis.reason = status, reason


def _probe_step(task: VidloraTask, video_id: int) -> tuple[ProbeInfo | None, str | None, FrameTable | None]:
    """Returns (probe info, video path, frame table if this call probed) or (None, None, None)
    when the video is finished with."""
    settings = get_settings()
    with session_scope() as session:
        video = session.get(Video, video_id)
        if video is None or video.status in BAD_VIDEO:
            return None, None, None
        if not begin_attempt(video, settings.max_attempts, counts=task.is_first_delivery):
            _close_analyses(session, video_id, AnalysisStatus.FAILED, video.reason or "failed")
            return None, None, None
        if video.status == VideoStatus.READY:  # probed by an earlier delivery: its facts are stored
            info = ProbeInfo(**{f: getattr(video, f) for f in PROBE_FIELDS}, bit_rate=None)
            return info, video.path, None
        video.status = VideoStatus.PROBING
        rel = video.path
    path = settings.media_root / rel
    try:
        info, table = probe_with_table(path, settings)
    except BadVideo as exc:
        with session_scope() as session:
            video = session.get(Video, video_id)
            video.status, video.reason = VideoStatus.REJECTED, exc.reason
            _close_analyses(session, video_id, AnalysisStatus.REJECTED, exc.reason)
        log.info("video %s rejected: %s", video_id, exc.reason)
        return None, None, None
    with session_scope() as session:
        video = session.get(Video, video_id)
        for field in PROBE_FIELDS:
            setattr(video, field, getattr(info, field))
        video.status, video.reason = VideoStatus.READY, None
    return info, rel, table


def _frames_step(video_id: int, info: ProbeInfo, rel: str, table: FrameTable | None) -> list[int]:
    """Sample every policy still needed; return the scenario ids whose analyses became ready.
    The packets are scanned once per video (here, or by the probe), whatever the policies."""
    settings = get_settings()
    store = MediaStore(settings.media_root)
    with session_scope() as session:
        rows = session.execute(
            select(Analysis.id, Scenario.id, Scenario.sampling)
            .join(Scenario, Scenario.id == Analysis.scenario_id)
            .where(Analysis.video_id == video_id, Analysis.status == AnalysisStatus.PENDING)
        ).all()
    by_policy: dict[str, tuple[SamplingPolicy, list[int]]] = {}
    for _analysis_id, scenario_id, sampling in rows:
        policy = SamplingPolicy.from_dict(sampling)
        by_policy.setdefault(policy.key(), (policy, []))[1].append(scenario_id)
    ready: list[int] = []
    reuse = FrameReuse()
    for key, (policy, scenario_ids) in by_policy.items():
        with session_scope() as session:
            frame_set = session.scalar(
                select(FrameSet).where(FrameSet.video_id == video_id, FrameSet.policy_key == key)
            )
            if frame_set is None:
                frame_set = FrameSet(video_id=video_id, policy_key=key, policy=policy.as_dict())
                session.add(frame_set)
                session.flush()
            frame_set_id, done = frame_set.id, frame_set.status == FrameSetStatus.DONE
        if not done and table is None:
            try:
                table = frame_table(settings.media_root / rel, info, settings)
            except BadVideo as exc:
                with session_scope() as session:
                    _close_analyses(session, video_id, AnalysisStatus.REJECTED, exc.reason)
                return ready
        if not done and not _sample(store, settings, video_id, frame_set_id, key, policy, info, rel, table, reuse):
            continue
        with session_scope() as session:
            for analysis in session.scalars(
                select(Analysis).where(
                    Analysis.video_id == video_id,
                    Analysis.scenario_id.in_(scenario_ids),
                    Analysis.status == AnalysisStatus.PENDING,
                )
            ):
                analysis.status, analysis.frame_set_id = AnalysisStatus.READY, frame_set_id
                analysis.ready_at = utcnow()
        ready.extend(scenario_ids)
    return ready


def _sample(store, settings, video_id, frame_set_id, key, policy, info, rel, table, reuse) -> bool:
    final_dir = store.frames_dir(video_id, policy.key_hash())
    work_dir = final_dir.with_name(final_dir.name + ".partial")
    shutil.rmtree(work_dir, ignore_errors=True)
    try:
        sampled = sample_video(settings.media_root / rel, policy, work_dir, info=info, settings=settings,
                               table=table, reuse=reuse)
    except BadVideo as exc:
        shutil.rmtree(work_dir, ignore_errors=True)
        with session_scope() as session:
            frame_set = session.get(FrameSet, frame_set_id)
            frame_set.status, frame_set.reason = FrameSetStatus.FAILED, exc.reason
            scenario_ids = [
                s.id for s in session.scalars(select(Scenario)) if SamplingPolicy.from_dict(s.sampling).key() == key
            ]
            _close_analyses(session, video_id, AnalysisStatus.REJECTED,
                            f"frame sampling failed: {exc.reason}", scenario_ids)
        return False
    # Frames become visible under their final name only once all are written.
    shutil.rmtree(final_dir, ignore_errors=True)
    work_dir.rename(final_dir)
    # Frame files are flat in their directory; keep them relative to the media root.
    files = [(final_dir / Path(f).name).relative_to(settings.media_root).as_posix() for f in sampled.files]
    with session_scope() as session:
        frame_set = session.get(FrameSet, frame_set_id)
        frame_set.timestamps = list(sampled.timestamps)
        frame_set.files = files
        frame_set.width, frame_set.height = sampled.width, sampled.height
        frame_set.backend = sampled.backend
        frame_set.deinterlace, frame_set.decode_note = sampled.deinterlace, sampled.note
        frame_set.status, frame_set.reason = FrameSetStatus.DONE, None
    return True


def _has_work(video_id: int) -> bool:
    with session_scope() as session:
        video = session.get(Video, video_id)
        if video is None or video.status in BAD_VIDEO:
            return False
        if video.status != VideoStatus.READY:
            return True
        return session.scalar(
            select(Analysis.id).where(Analysis.video_id == video_id, Analysis.status == AnalysisStatus.PENDING).limit(1)
        ) is not None


@shared_task(base=VidloraTask, bind=True, name=messages.PREPARE_VIDEO)
def prepare_video(self: VidloraTask, video_id: int) -> int:
    with try_lock(f"prepare:{video_id}") as mine:
        # A duplicate message while another live worker prepares this video, or one for a
        # video with nothing left to do, is dropped without counting an attempt.
        if not mine or not _has_work(video_id):
            return 0
        with metrics.decode_cpu():  # probe and sampling, decoder subprocesses included
            info, rel, table = _probe_step(self, video_id)
            ready = _frames_step(video_id, info, rel, table) if info is not None else None
        if ready is None:
            return 0
    if ready:
        messages.dispatch_ready()
    return len(ready)
