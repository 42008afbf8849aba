"""Progress of a batch, read from the database (the CLI and the web UI show the same view)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from vidlora.reasons import in_words, member_name
from vidlora.lifecycle import FINAL_ANALYSIS, AnalysisStatus, BatchStatus, FrameSetStatus, ItemStatus, UploadStatus
from vidlora.models import Analysis, Batch, BatchItem, FrameSet, Result, Scenario, Video


@dataclass
class AnalysisView:
    id: int
    scenario: str
    status: str
    reason: str | None
    attempts: int
    result_id: int | None = None
    reused_from: int | None = None  # the earlier batch whose analysis this is (same content re-uploaded)


@dataclass
class VideoView:
    id: int
    name: str
    status: str
    reason: str | None
    duration_s: float | None
    width: int | None
    height: int | None
    codec: str | None
    analyses: list[AnalysisView] = field(default_factory=list)
    has_frames: bool = False  # a picture to show (a placeholder until then)


# What a batch's analyses came to, in words: finished-with-problems must never read as fine.
OUTCOME_LABELS = ((AnalysisStatus.DONE, "done"), (AnalysisStatus.FAILED, "failed"),
                  (AnalysisStatus.REJECTED, "not analysable"))


def outcome_text(counts: Counter, files_rejected: int) -> str:
    """ "3 done · 1 failed · 2 not analysable, of 6 · 1 file rejected" """
    total = sum(counts.values())
    parts = [f"{counts[s]} {label}" for s, label in OUTCOME_LABELS if counts.get(s)]
    running = total - sum(n for s, n in counts.items() if s in FINAL_ANALYSIS)
    if running:
        parts.append(f"{running} to go")
    text = (" · ".join(parts) + f", of {total}") if total else "no analyses"
    if files_rejected:
        text += f" · {files_rejected} file{'s' if files_rejected != 1 else ''} rejected"
    return text


def problem_count(counts: Counter, files_rejected: int) -> int:
    """Analyses that failed or could not run, and files refused; a batch that came to no
    analysis at all (a zip of no videos) is a problem too, never a quiet "finished"."""
    problems = counts.get(AnalysisStatus.FAILED, 0) + counts.get(AnalysisStatus.REJECTED, 0) + files_rejected
    return problems or (0 if sum(counts.values()) else 1)


def batch_state(status: str, finished: bool, problems: int) -> str:
    """A batch's state in the words the pages, the API (``state``) and the CLI all use."""
    if finished:
        return "finished with problems" if problems else "finished"
    if status == BatchStatus.INGESTING:
        return "receiving files"
    return "analysing"


@dataclass
class BatchView:
    id: int
    name: str
    status: str
    reason: str | None
    scenarios: list[str]
    videos: list[VideoView]
    rejected: list[tuple[str, str]]  # (member name, reason)
    skipped: list[tuple[str, str]]
    uploads_pending: int
    titles: dict[str, str] = field(default_factory=dict)  # scenario name -> title people read

    @property
    def analysis_counts(self) -> Counter:
        return Counter(a.status for v in self.videos for a in v.analyses)

    @property
    def finished(self) -> bool:
        """Nothing left to happen: every upload ingested, every analysis in a final state."""
        return (
            self.status != BatchStatus.INGESTING
            and self.uploads_pending == 0
            and all(a.status in FINAL_ANALYSIS for v in self.videos for a in v.analyses)
        )

    @property
    def reused(self) -> dict[int, int]:
        """Earlier batch -> how many of this batch's analyses it had already done."""
        return dict(Counter(a.reused_from for v in self.videos for a in v.analyses if a.reused_from))

    @property
    def outcome(self) -> str:
        return outcome_text(self.analysis_counts, len(self.rejected))

    @property
    def problems(self) -> int:
        return problem_count(self.analysis_counts, len(self.rejected))

    @property
    def state(self) -> str:
        return batch_state(self.status, self.finished, self.problems)

    def as_dict(self) -> dict:
        return {
            "id": self.id, "name": self.name, "status": self.status, "state": self.state, "reason": self.reason,
            "scenarios": self.scenarios, "titles": self.titles, "finished": self.finished,
            "counts": dict(self.analysis_counts),
            "outcome": self.outcome, "problems": self.problems,
            "reused": {str(k): n for k, n in self.reused.items()},
            "videos": [
                {**{k: v for k, v in vv.__dict__.items() if k != "analyses"},
                 "analyses": [a.__dict__ for a in vv.analyses]}
                for vv in self.videos
            ],
            # "label" and "words": the name and the reason as the page shows them
            "rejected": [{"name": n, "reason": r, "label": member_name(n), "words": in_words(r)} for n, r in self.rejected],
            "skipped": [{"name": n, "reason": r, "label": member_name(n), "words": in_words(r)} for n, r in self.skipped],
        }


def batch_view(session: Session, batch_id: int) -> BatchView | None:
    batch = session.get(Batch, batch_id)
    if batch is None:
        return None
    items = session.scalars(select(BatchItem).where(BatchItem.batch_id == batch_id).order_by(BatchItem.id)).all()
    video_ids = [i.video_id for i in items if i.video_id is not None]
    videos = {v.id: v for v in session.scalars(select(Video).where(Video.id.in_(video_ids)))}
    analyses = session.execute(
        select(Analysis, Scenario.name, Result.id)
        .join(Scenario, Scenario.id == Analysis.scenario_id)
        .outerjoin(Result, Result.analysis_id == Analysis.id)
        .where(Analysis.video_id.in_(video_ids), Scenario.name.in_(batch.scenario_names))
        .order_by(Analysis.video_id, Scenario.name)
    ).all()
    per_video: dict[int, list[AnalysisView]] = {}
    for analysis, scenario, result_id in analyses:
        per_video.setdefault(analysis.video_id, []).append(
            AnalysisView(analysis.id, scenario, analysis.status, analysis.reason, analysis.attempts, result_id,
                         analysis.batch_id if analysis.batch_id not in (None, batch_id) else None)
        )
    with_frames = set(session.scalars(
        select(FrameSet.video_id).where(FrameSet.video_id.in_(video_ids), FrameSet.status == FrameSetStatus.DONE)))
    titles = dict(session.execute(select(Scenario.name, Scenario.title).where(Scenario.name.in_(batch.scenario_names))).all())
    views: list[VideoView] = []
    seen: set[int] = set()
    for item in items:
        if item.video_id is None or item.video_id in seen:
            continue
        seen.add(item.video_id)
        video = videos[item.video_id]
        views.append(VideoView(
            video.id, item.name, video.status, video.reason, video.duration_s, video.width,
            video.height, video.codec, per_video.get(video.id, []), video.id in with_frames,
        ))
    return BatchView(
        id=batch.id, name=batch.name, status=batch.status, reason=batch.reason,
        scenarios=list(batch.scenario_names), videos=views,
        titles={name: titles.get(name) or name for name in batch.scenario_names},
        rejected=[(i.name, i.reason or "") for i in items if i.status == ItemStatus.REJECTED],
        skipped=[(i.name, i.reason or "") for i in items if i.status == ItemStatus.SKIPPED],
        uploads_pending=sum(1 for u in batch.uploads if u.status == UploadStatus.PENDING),
    )


def wait(batch_id: int, timeout: float = 0.0, poll_s: float = 1.0) -> BatchView | None:
    """The batch's view once it is finished, or when `timeout` seconds (0: never) have passed."""
    import time

    from vidlora.db import session_scope

    deadline = time.monotonic() + timeout if timeout else None
    while True:
        with session_scope() as session:
            view = batch_view(session, batch_id)
        if view is None or view.finished or (deadline and time.monotonic() > deadline):
            return view
        time.sleep(poll_s)


def stream_words(stream: dict | None) -> str:
    """A streaming GPU worker's loop in words (its heartbeat's ``stream``), for the CLI and the
    Scenarios page: "12 in flight of 256 (artifact_identification 5, tomb_structure 7); 3 more
    waiting; admitted after 0.4 s on average; 1,230 output tokens/s"."""
    if not stream:
        return "closed batches (gpu_worker_mode=batch)"
    in_flight = stream.get("in_flight") or {}
    total = sum(in_flight.values())
    per = ", ".join(f"{a} {n}" for a, n in sorted(in_flight.items()))
    waiting = max(0, int(stream.get("held") or 0) - total)
    wait = stream.get("mean_admission_wait_s")
    parts = [f"{total} in flight of {stream.get('capacity', '?')}" + (f" ({per})" if per else "")]
    if stream.get("engine_waiting"):
        # Admitted, but vLLM holds them back (its cache is full): they wait with deadlines running.
        parts.append(f"{stream.get('engine_running') or 0} running in the engine, "
                     f"{stream['engine_waiting']} queued inside it")
    parts += [f"{waiting} more waiting" if waiting else "nothing waiting",
             f"admitted after {wait:.1f} s on average" if wait is not None else "nothing admitted yet",
             f"{stream.get('tokens_per_s') or 0:,.0f} output tokens/s"]
    if stream.get("storing"):
        parts.append(f"{stream['storing']} finished, being stored")
    return "; ".join(parts)
