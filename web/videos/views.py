from __future__ import annotations

from flask import abort, render_template, send_file
from sqlalchemy import select
from sqlalchemy.orm import selectinload

from vidlora.lifecycle import FrameSetStatus
from vidlora.models import Analysis, BatchItem, FrameSet, Result, Video
from web.database import get_db
from web.videos import bp
from web.videos.media import media_file, video_mimetype


def _video_or_404(video_id: int) -> Video:
    video = get_db().get(Video, video_id)
    if video is None:
        abort(404, f"There is no video {video_id}.")
    return video


@bp.get("/<id:video_id>")
def detail(video_id: int):
    session = get_db()
    video = _video_or_404(video_id)
    analyses = session.scalars(
        select(Analysis).where(Analysis.video_id == video_id)
        .options(selectinload(Analysis.scenario), selectinload(Analysis.result).selectinload(Result.reviews))
        .order_by(Analysis.id)
    ).all()
    frame_sets = session.scalars(
        select(FrameSet).where(FrameSet.video_id == video_id, FrameSet.status == FrameSetStatus.DONE)
        .order_by(FrameSet.id)
    ).all()
    uses = {fs.id: [a.scenario.title for a in analyses if a.frame_set_id == fs.id] for fs in frame_sets}
    batches = session.scalars(
        select(BatchItem).where(BatchItem.video_id == video_id).order_by(BatchItem.batch_id)
    ).all()
    return render_template(
        "videos/detail.html", video=video, analyses=analyses, frame_sets=frame_sets, uses=uses,
        batch_items=batches, playable=media_file(video.path) is not None,
    )


@bp.get("/<id:video_id>/file", endpoint="file")
def video_file(video_id: int):
    """The stored video, with Range support so the player can seek."""
    video = _video_or_404(video_id)
    path = media_file(video.path)
    if path is None:
        abort(404, "The video file is not in the media store.")
    return send_file(path, mimetype=video_mimetype(path, video.original_name), conditional=True,
                     download_name=video.original_name, max_age=3600)


@bp.get("/frames/<id:frame_set_id>/<int:index>.jpg")
def frame(frame_set_id: int, index: int):
    frame_set = get_db().get(FrameSet, frame_set_id)
    if frame_set is None or index >= len(frame_set.files or []):
        abort(404, "There is no such frame.")
    path = media_file(frame_set.files[index])
    if path is None:
        abort(404, "The frame file is not in the media store.")
    return send_file(path, mimetype="image/jpeg", conditional=True, max_age=86400)


@bp.get("/<id:video_id>/thumbnail.jpg")
def thumbnail(video_id: int):
    """The middle frame of the video's first frame set: a picture to recognise it by."""
    frame_set = get_db().scalar(
        select(FrameSet).where(FrameSet.video_id == video_id, FrameSet.status == FrameSetStatus.DONE)
        .order_by(FrameSet.id).limit(1)
    )
    files = (frame_set.files or []) if frame_set else []
    path = media_file(files[len(files) // 2]) if files else None
    if path is None:
        abort(404, "No frames yet.")
    return send_file(path, mimetype="image/jpeg", conditional=True, max_age=600)
