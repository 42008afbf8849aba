"""Audit the database after any run: what was lost, duplicated, stuck, or stored unchecked.

The fault tests end by running it and require zeros; operators run `vidlora audit`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from vidlora.lifecycle import FINAL_ANALYSIS, SETTLED_VIDEO, AnalysisStatus, ItemStatus, UploadStatus
from vidlora.models import Analysis, BatchItem, Result, Scenario, Upload, Video
from vidlora.result_health import ResultHealth


@dataclass
class AuditReport:
    lost_videos: list[str] = field(default_factory=list)
    duplicated_analyses: list[tuple[int, int]] = field(default_factory=list)
    duplicated_results: list[int] = field(default_factory=list)
    stuck_analyses: list[int] = field(default_factory=list)
    stuck_videos: list[int] = field(default_factory=list)
    unchecked_results: list[int] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.__dict__.items()}

    @property
    def clean(self) -> bool:
        return not any(self.counts.values())


def audit(session: Session, batch_ids: list[int] | None = None) -> AuditReport:
    report = AuditReport()
    items = select(BatchItem)
    if batch_ids is not None:
        items = items.where(BatchItem.batch_id.in_(batch_ids))
    scenario_ids: dict[int, set[int]] = {}
    for item in session.scalars(items):
        # A stored member must have its video, and the video one analysis per scenario of the
        # batch (the analysis may belong to an earlier batch that brought the same content).
        if item.status != ItemStatus.STORED:
            continue
        if item.video_id is None or session.get(Video, item.video_id) is None:
            report.lost_videos.append(item.name)
            continue
        if item.batch_id not in scenario_ids:
            names = list(item.batch.scenario_names)
            scenario_ids[item.batch_id] = set(session.scalars(select(Scenario.id).where(Scenario.name.in_(names))))
        have = set(session.scalars(select(Analysis.scenario_id).where(Analysis.video_id == item.video_id)))
        if scenario_ids[item.batch_id] - have:
            report.lost_videos.append(f"analyses-of:{item.name}")
    uploads = select(Upload).where(Upload.status == UploadStatus.PENDING)
    if batch_ids is not None:
        uploads = uploads.where(Upload.batch_id.in_(batch_ids))
    report.lost_videos += [f"upload:{u.name}" for u in session.scalars(uploads)]
    analyses = select(Analysis)
    if batch_ids is not None:
        video_ids = select(BatchItem.video_id).where(BatchItem.batch_id.in_(batch_ids))
        analyses = analyses.where(Analysis.video_id.in_(video_ids))
    rows = session.scalars(analyses).all()
    report.stuck_analyses = [a.id for a in rows if a.status not in FINAL_ANALYSIS]
    report.stuck_videos = sorted({
        a.video_id for a in rows if a.video.status not in SETTLED_VIDEO
    })
    report.duplicated_analyses = [
        (v, s) for v, s, n in session.execute(
            select(Analysis.video_id, Analysis.scenario_id, func.count())
            .group_by(Analysis.video_id, Analysis.scenario_id).having(func.count() > 1)
        )
    ]
    report.duplicated_results = list(session.scalars(
        select(Result.analysis_id).group_by(Result.analysis_id).having(func.count() > 1)
    ))
    ids = [a.id for a in rows]
    for result in session.scalars(select(Result).where(Result.analysis_id.in_(ids))):
        if ResultHealth.of(result.health).ok is not True:
            report.unchecked_results.append(result.id)
    for analysis in rows:
        if analysis.status == AnalysisStatus.DONE and analysis.result is None:
            report.lost_videos.append(f"result-of-analysis:{analysis.id}")
    return report
