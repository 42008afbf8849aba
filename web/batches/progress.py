"""Progress numbers for many batches at once (the list page), in two queries, not 2 per batch."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from flask import url_for
from sqlalchemy import distinct, func, select
from sqlalchemy.orm import Session

from vidlora.lifecycle import FINAL_ANALYSIS, BatchStatus, ItemStatus, UploadStatus
from vidlora.models import Analysis, Batch, BatchItem, Scenario, Upload
from vidlora.status import BatchView, batch_state, outcome_text, problem_count


@dataclass
class BatchSummary:
    id: int
    status: str
    counts: Counter = field(default_factory=Counter)
    uploads_pending: int = 0
    files_rejected: int = 0  # members that never became a video (corrupt, hostile, not a video)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def final(self) -> int:
        return sum(n for s, n in self.counts.items() if s in FINAL_ANALYSIS)

    @property
    def finished(self) -> bool:
        return self.status != BatchStatus.INGESTING and self.uploads_pending == 0 and self.final == self.total

    @property
    def text(self) -> str:
        return outcome_text(self.counts, self.files_rejected)

    @property
    def problems(self) -> int:
        return problem_count(self.counts, self.files_rejected)

    @property
    def state(self) -> str:
        return batch_state(self.status, self.finished, self.problems)

    def as_dict(self) -> dict:
        return {"id": self.id, "status": self.status, "state": self.state, "counts": dict(self.counts), "total": self.total,
                "final": self.final, "finished": self.finished, "uploads_pending": self.uploads_pending,
                "files_rejected": self.files_rejected, "problems": self.problems, "text": self.text}



def summarise(session: Session, batches: list[Batch]) -> dict[int, BatchSummary]:
    out = {b.id: BatchSummary(b.id, b.status) for b in batches}
    wanted = {b.id: set(b.scenario_names) for b in batches}
    if not out:
        return out
    rows = session.execute(
        select(BatchItem.batch_id, Scenario.name, Analysis.status, func.count(distinct(Analysis.id)))
        .join(Analysis, Analysis.video_id == BatchItem.video_id)
        .join(Scenario, Scenario.id == Analysis.scenario_id)
        .where(BatchItem.batch_id.in_(out))
        .group_by(BatchItem.batch_id, Scenario.name, Analysis.status)
    )
    for batch_id, scenario, status, n in rows:
        # A video seen before keeps analyses of other scenarios; they are not this batch's work.
        if scenario in wanted[batch_id]:
            out[batch_id].counts[status] += n
    pending = session.execute(
        select(Upload.batch_id, func.count()).where(Upload.batch_id.in_(out), Upload.status == UploadStatus.PENDING)
        .group_by(Upload.batch_id)
    )
    for batch_id, n in pending:
        out[batch_id].uploads_pending = n
    rejected = session.execute(
        select(BatchItem.batch_id, func.count()).where(BatchItem.batch_id.in_(out), BatchItem.status == ItemStatus.REJECTED)
        .group_by(BatchItem.batch_id)
    )
    for batch_id, n in rejected:
        out[batch_id].files_rejected = n
    return out


def view_dict(view: BatchView) -> dict:
    """The batch view as JSON, with the links the page needs to draw new rows."""
    data = view.as_dict()
    data["uploads_pending"] = view.uploads_pending
    for video in data["videos"]:
        video["url"] = url_for("videos.detail", video_id=video["id"])
        video["thumb_url"] = url_for("videos.thumbnail", video_id=video["id"]) if video["has_frames"] else None
        for analysis in video["analyses"]:
            rid = analysis["result_id"]
            analysis["result_url"] = url_for("review.result", result_id=rid) if rid is not None else None
            earlier = analysis["reused_from"]
            analysis["reused_url"] = url_for("batches.detail", batch_id=earlier) if earlier else None
    return data
