"""The system of record. Every status is a column here (its states: `vidlora.lifecycle`);
Celery's own state is never consulted.

Unique keys make every write idempotent under re-delivery: one video per content hash, one
analysis per (video, scenario), one frame set per (video, sampling policy), one result per
analysis, one batch item per (batch, member name).
"""

from __future__ import annotations

import secrets
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
    text as sql_text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship, validates

from vidlora.lifecycle import (
    AdapterStatus,
    AnalysisStatus,
    BatchStatus,
    FrameSetStatus,
    ItemStatus,
    ReviewAction,
    ReleaseStatus,
    ResumableStatus,
    ReviewState,
    Role,
    TokenScope,
    UploadStatus,
    VideoStatus,
    WorkerStatus,
    check_analysis_move,
    values,
)

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def as_utc(value: datetime) -> datetime:
    """An aware UTC datetime: SQLite hands back naive ones, and they are UTC like everything
    vidlora writes."""
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


def _status_check(name: str, states: type, column: str = "status") -> CheckConstraint:
    allowed = ", ".join(f"'{v}'" for v in values(states))
    return CheckConstraint(f"{column} IN ({allowed})", name=name)


Timestamp = DateTime(timezone=True)
# A structured answer: JSONB on PostgreSQL (indexable, compared by value), JSON elsewhere.
Document = JSON().with_variant(JSONB(), "postgresql")


class Scenario(Base):
    __tablename__ = "scenario"
    __table_args__ = (_status_check("adapter_status", AdapterStatus, "adapter_status"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    title: Mapped[str] = mapped_column(String(200))
    description: Mapped[str] = mapped_column(Text, default="")
    adapter_path: Mapped[str | None] = mapped_column(String(1024))
    adapter_version: Mapped[str | None] = mapped_column(String(64))  # content hash of the adapter
    # Names, sizes and mtimes of the adapter's files when adapter_version was hashed: while
    # they are unchanged the version is not read again (20 x 27B adapters: ~20 GB per sync).
    adapter_fingerprint: Mapped[str | None] = mapped_column(String(64))
    # The GPU workers' registration verdict (engine_patch.registration): "ok", "refused"
    # (adapter_reason names the module and why; its analyses fail with it), "unchecked"
    # (no worker has registered this version yet) or "none" (base model, no adapter).
    adapter_status: Mapped[str] = mapped_column(String(16), default=AdapterStatus.UNCHECKED,
                                                server_default=AdapterStatus.UNCHECKED.value)
    adapter_reason: Mapped[str | None] = mapped_column(Text)
    adapter_digest: Mapped[str | None] = mapped_column(String(64))  # of the normalised weights
    system_prompt: Mapped[str | None] = mapped_column(Text)
    prompt: Mapped[str] = mapped_column(Text)
    sampling: Mapped[dict[str, Any]] = mapped_column(default=dict)
    generation: Mapped[dict[str, Any]] = mapped_column(default=dict)
    output_schema: Mapped[dict[str, Any] | None] = mapped_column()
    latency_target_s: Mapped[float | None] = mapped_column(Float)  # P95 upload-to-result target
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow, onupdate=utcnow)


class Batch(Base):
    """One upload, archive or CLI invocation."""

    __tablename__ = "batch"
    __table_args__ = (_status_check("status", BatchStatus),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    source: Mapped[str] = mapped_column(String(16))  # cli | web | api
    scenario_names: Mapped[list[Any]] = mapped_column(default=list)
    status: Mapped[str] = mapped_column(String(16), default=BatchStatus.INGESTING)
    reason: Mapped[str | None] = mapped_column(Text)
    created_by: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)

    uploads: Mapped[list[Upload]] = relationship(back_populates="batch", order_by="Upload.id")
    items: Mapped[list[BatchItem]] = relationship(back_populates="batch", order_by="BatchItem.id")


class Upload(Base):
    """A file parked in the media store's upload area, waiting for the ingest task."""

    __tablename__ = "upload"
    __table_args__ = (_status_check("status", UploadStatus),)

    id: Mapped[int] = mapped_column(primary_key=True)
    batch_id: Mapped[int] = mapped_column(ForeignKey("batch.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(1024))
    path: Mapped[str] = mapped_column(String(1024))  # relative to media_root
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16), default=UploadStatus.PENDING)
    reason: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)
    # Touched by every delivery and by the reconciler's re-send: "pending and not touched for
    # stale_after_s" is what an upload whose message was lost looks like.
    updated_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow, onupdate=utcnow)

    batch: Mapped[Batch] = relationship(back_populates="uploads")


class ResumableUpload(Base):
    """A file arriving in pieces over tus (vidlora.resumable): its bytes so far live in the
    media store's ``resumable/`` folder; once complete it is handed to a batch, which parks it
    as an ``Upload`` and ingests it like any other."""

    __tablename__ = "resumable_upload"
    __table_args__ = (_status_check("status", ResumableStatus),)

    id: Mapped[int] = mapped_column(primary_key=True)
    # The upload's URL names it by this random key, never by the row id: not guessable.
    key: Mapped[str] = mapped_column(String(64), unique=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("app_user.id", ondelete="CASCADE"), index=True)
    filename: Mapped[str] = mapped_column(String(255))
    length: Mapped[int] = mapped_column(BigInteger)
    offset: Mapped[int] = mapped_column(BigInteger, default=0)
    path: Mapped[str] = mapped_column(String(1024))  # relative to media_root
    status: Mapped[str] = mapped_column(String(16), default=ResumableStatus.RECEIVING)
    batch_id: Mapped[int | None] = mapped_column(ForeignKey("batch.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)
    # Touched by every chunk: an upload untouched for resumable_expire_after_s has stalled.
    updated_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow, onupdate=utcnow, index=True)


class BatchItem(Base):
    """What became of one member of a batch: a stored video, or why it was not."""

    __tablename__ = "batch_item"
    __table_args__ = (
        UniqueConstraint("batch_id", "name"),
        _status_check("status", ItemStatus),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    batch_id: Mapped[int] = mapped_column(ForeignKey("batch.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(1024))
    status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    video_id: Mapped[int | None] = mapped_column(ForeignKey("video.id"), index=True)
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)

    batch: Mapped[Batch] = relationship(back_populates="items")
    video: Mapped[Video | None] = relationship()


class Video(Base):
    __tablename__ = "video"
    __table_args__ = (_status_check("status", VideoStatus),)

    id: Mapped[int] = mapped_column(primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    path: Mapped[str] = mapped_column(String(1024))  # relative to media_root
    original_name: Mapped[str] = mapped_column(String(1024))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16), default=VideoStatus.REGISTERED)
    reason: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    container: Mapped[str | None] = mapped_column(String(64))
    codec: Mapped[str | None] = mapped_column(String(64))
    width: Mapped[int | None] = mapped_column(Integer)
    height: Mapped[int | None] = mapped_column(Integer)
    rotation: Mapped[int | None] = mapped_column(Integer)
    fps: Mapped[float | None] = mapped_column(Float)
    duration_s: Mapped[float | None] = mapped_column(Float)
    frame_count: Mapped[int | None] = mapped_column(Integer)
    # "progressive" or the field order of interlaced video ("tt", "bb", ...), see media/probe.py
    field_order: Mapped[str | None] = mapped_column(String(16))
    # What the header declares, when it declares a span; truncated: the file ends before it
    # (or mid-packet) and only duration_s of it is analysed.
    declared_duration_s: Mapped[float | None] = mapped_column(Float)
    truncated: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow, onupdate=utcnow)

    analyses: Mapped[list[Analysis]] = relationship(back_populates="video", order_by="Analysis.id")
    frame_sets: Mapped[list[FrameSet]] = relationship(back_populates="video")


class FrameSet(Base):
    """Frames of one video under one sampling policy, shared by every scenario using it."""

    __tablename__ = "frame_set"
    __table_args__ = (
        UniqueConstraint("video_id", "policy_key"),
        _status_check("status", FrameSetStatus),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    video_id: Mapped[int] = mapped_column(ForeignKey("video.id", ondelete="CASCADE"), index=True)
    policy_key: Mapped[str] = mapped_column(String(255))
    policy: Mapped[dict[str, Any]] = mapped_column(default=dict)
    status: Mapped[str] = mapped_column(String(16), default=FrameSetStatus.PENDING)
    reason: Mapped[str | None] = mapped_column(Text)
    timestamps: Mapped[list[Any]] = mapped_column(default=list)
    files: Mapped[list[Any]] = mapped_column(default=list)  # relative to media_root
    width: Mapped[int | None] = mapped_column(Integer)
    height: Mapped[int | None] = mapped_column(Integer)
    backend: Mapped[str | None] = mapped_column(String(32))
    deinterlace: Mapped[str | None] = mapped_column(String(16))  # "bwdif" when the frames were deinterlaced
    decode_note: Mapped[str | None] = mapped_column(Text)  # e.g. seeking failed, decoded from the start
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)

    video: Mapped[Video] = relationship(back_populates="frame_sets")


class Analysis(Base):
    __tablename__ = "analysis"
    __table_args__ = (
        UniqueConstraint("video_id", "scenario_id"),
        _status_check("status", AnalysisStatus),
        Index("ix_analysis_status_scenario", "status", "scenario_id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    video_id: Mapped[int] = mapped_column(ForeignKey("video.id", ondelete="CASCADE"), index=True)
    scenario_id: Mapped[int] = mapped_column(ForeignKey("scenario.id"), index=True)
    batch_id: Mapped[int | None] = mapped_column(ForeignKey("batch.id", ondelete="SET NULL"), index=True)
    frame_set_id: Mapped[int | None] = mapped_column(ForeignKey("frame_set.id"))
    status: Mapped[str] = mapped_column(String(16), default=AnalysisStatus.PENDING)
    reason: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(128))
    engine: Mapped[dict[str, Any] | None] = mapped_column()
    adapter_version: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)
    ready_at: Mapped[datetime | None] = mapped_column(Timestamp)
    queued_at: Mapped[datetime | None] = mapped_column(Timestamp)
    started_at: Mapped[datetime | None] = mapped_column(Timestamp)
    finished_at: Mapped[datetime | None] = mapped_column(Timestamp)

    video: Mapped[Video] = relationship(back_populates="analyses")
    scenario: Mapped[Scenario] = relationship()
    batch: Mapped[Batch | None] = relationship()
    frame_set: Mapped[FrameSet | None] = relationship()
    result: Mapped[Result | None] = relationship(back_populates="analysis", uselist=False)

    @validates("status")
    def _check_move(self, _key: str, new: str) -> AnalysisStatus:
        # Every code path that moves an analysis passes here (bulk UPDATEs do not: the
        # reconciler's and dispatcher's guard themselves with row locks and WHERE clauses).
        return check_analysis_move(self.status, new)


class Result(Base):
    __tablename__ = "result"
    __table_args__ = (
        _status_check("review_state", ReviewState, "review_state"),
        # The reviewed tenth of a scenario's results, found without reading the rest: agreement
        # and calibration score only these (vidlora.feedback.scores; issue 58).
        Index("ix_result_reviewed", "analysis_id", postgresql_where=sql_text("review_state <> 'unreviewed'"),
              sqlite_where=sql_text("review_state <> 'unreviewed'")),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    analysis_id: Mapped[int] = mapped_column(
        ForeignKey("analysis.id", ondelete="CASCADE"), unique=True
    )
    text: Mapped[str] = mapped_column(Text)  # the model's output, untrusted, never edited
    # A structured scenario's answer as data: the model's (valid against the schema it ran
    # with) and a reviewer's schema-valid edit; its leaves are indexed in result_field.
    parsed: Mapped[dict[str, Any] | None] = mapped_column(Document)
    edited_parsed: Mapped[dict[str, Any] | None] = mapped_column(Document)
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    output_tokens: Mapped[int] = mapped_column(Integer)
    latency_s: Mapped[float] = mapped_column(Float)
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    # The tokens the engine produced: a streamed result shares its engine steps with whatever
    # else was in flight, so it is re-checked against a run alone token by token (near ties).
    token_ids: Mapped[list[Any] | None] = mapped_column()
    health: Mapped[dict[str, Any]] = mapped_column(default=dict)
    model: Mapped[str] = mapped_column(String(1024))
    adapter: Mapped[str | None] = mapped_column(String(255))
    adapter_version: Mapped[str | None] = mapped_column(String(64))
    review_state: Mapped[str] = mapped_column(String(16), default=ReviewState.UNREVIEWED)
    edited_text: Mapped[str | None] = mapped_column(Text)
    # A gold result: a reviewed answer the team holds out of training and measures every new
    # adapter version on (vidlora.feedback.gold); set when marked, by whom.
    gold_at: Mapped[datetime | None] = mapped_column(Timestamp)
    gold_by: Mapped[int | None] = mapped_column(ForeignKey("app_user.id", ondelete="SET NULL"))
    # Moved on by every review action (web.review.actions): a reviewer's save, approve or
    # reject names the version it was made against, and a stale one is refused, not applied.
    review_version: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # How sure the model was of this answer: its least certain field's confidence, from the
    # tokens that wrote it (vidlora.results.confidence); None: unknown (a free-text answer, or
    # stored before confidences were). Indexed: the review queue reads least certain first.
    confidence: Mapped[float | None] = mapped_column(Float, index=True)
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)

    analysis: Mapped[Analysis] = relationship(back_populates="result")
    reviews: Mapped[list[Review]] = relationship(back_populates="result", order_by="Review.id")
    field_confidences: Mapped[list[ResultConfidence]] = relationship(
        order_by="ResultConfidence.id", cascade="all, delete-orphan", passive_deletes=True)


class ResultConfidence(Base):
    """One top-level field's confidence in a result's answer, as the model wrote it (an edit
    does not change it: it is the model's doubt that reviewers and calibration read)."""

    __tablename__ = "result_confidence"
    __table_args__ = (Index("ix_result_confidence_field_confidence", "field", "confidence"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    result_id: Mapped[int] = mapped_column(ForeignKey("result.id", ondelete="CASCADE"), index=True)
    field: Mapped[str] = mapped_column(String(255))  # a top-level key of the answer
    confidence: Mapped[float] = mapped_column(Float)
    tokens: Mapped[int] = mapped_column(Integer)  # the decision tokens it was read from


class ResultField(Base):
    """One leaf of a result's current structured answer (``vidlora.results.fields``): the
    table field queries, ranges and facet counts run on, the same on every database."""

    __tablename__ = "result_field"
    __table_args__ = (
        Index("ix_result_field_path_text", "path", "text"),
        Index("ix_result_field_path_num", "path", "num"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    result_id: Mapped[int] = mapped_column(ForeignKey("result.id", ondelete="CASCADE"), index=True)
    path: Mapped[str] = mapped_column(String(255))  # "finds.material"
    item: Mapped[int | None] = mapped_column(Integer)  # index in the path's first array
    text: Mapped[str | None] = mapped_column(String(512))  # strings, enums, "true"/"false"
    num: Mapped[float | None] = mapped_column(Float)  # numbers and integers
    # True when an earlier leaf of the same result has this path and value (two bronze finds):
    # a facet counts results, and skipping these counts them without a DISTINCT over every row.
    repeat: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class Review(Base):
    """Append-only history of what reviewers did to a result."""

    __tablename__ = "review"
    __table_args__ = (_status_check("action", ReviewAction, "action"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    result_id: Mapped[int] = mapped_column(ForeignKey("result.id", ondelete="CASCADE"), index=True)
    user_id: Mapped[int | None] = mapped_column(ForeignKey("app_user.id", ondelete="SET NULL"))
    action: Mapped[str] = mapped_column(String(16))
    text: Mapped[str | None] = mapped_column(Text)  # the edited text, for "edit"
    note: Mapped[str | None] = mapped_column(Text)
    version: Mapped[int | None] = mapped_column(Integer)  # the result's review version it made
    # Applied from the conflict page: the version the reviewer's page showed when this action
    # was first refused as stale (it went over another reviewer's change on purpose).
    reapplied_from: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)

    result: Mapped[Result] = relationship(back_populates="reviews")
    user: Mapped[User | None] = relationship()


class ReviewLease(Base):
    """A reviewer holds a result they opened from the review queue until ``expires_at``
    (web.review.leases): a courtesy so the queue hands others the next answer, never a lock."""

    __tablename__ = "review_lease"

    result_id: Mapped[int] = mapped_column(ForeignKey("result.id", ondelete="CASCADE"), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("app_user.id", ondelete="CASCADE"), index=True)
    expires_at: Mapped[datetime] = mapped_column(Timestamp, index=True)

    user: Mapped[User] = relationship()


class User(Base):
    __tablename__ = "app_user"
    __table_args__ = (_status_check("role", Role, "role"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    username: Mapped[str] = mapped_column(String(64), unique=True)
    password_hash: Mapped[str] = mapped_column(String(255))
    is_active: Mapped[bool] = mapped_column(Boolean, default=True)
    role: Mapped[str] = mapped_column(String(16), default=Role.REVIEWER, server_default=Role.REVIEWER.value)
    # Part of every signed session cookie: replaced at sign-out and on a password change, so
    # a copied cookie dies with them (cookies are signed, not stored, so nothing else could).
    session_token: Mapped[str] = mapped_column(String(64), default=lambda: secrets.token_hex(16))
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)


class ApiToken(Base):
    """A script's credential: only its SHA-256 is stored (the token is 32 random bytes, so a
    fast hash is enough), shown once at creation; ``prefix`` names it in lists."""

    __tablename__ = "api_token"
    __table_args__ = (_status_check("scope", TokenScope, "scope"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("app_user.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    prefix: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scope: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(Timestamp)
    revoked_at: Mapped[datetime | None] = mapped_column(Timestamp)

    user: Mapped[User] = relationship()


class Worker(Base):
    """Heartbeat row of one GPU worker: what it runs on and which adapters it holds."""

    __tablename__ = "worker"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    queue: Mapped[str] = mapped_column(String(160))  # its own queue, for adapter affinity
    device: Mapped[str | None] = mapped_column(String(255))
    versions: Mapped[dict[str, Any]] = mapped_column(default=dict)
    adapters_resident: Mapped[list[Any]] = mapped_column(default=list)
    adapter_loads: Mapped[int] = mapped_column(Integer, default=0)
    last_canary: Mapped[dict[str, Any] | None] = mapped_column()
    # The streaming loop (tasks.gpu_stream.StreamRunner.status): in flight per adapter, held,
    # admission wait, tokens/s; None for a worker in batch mode.
    stream: Mapped[dict[str, Any] | None] = mapped_column()
    status: Mapped[str] = mapped_column(String(16), default=WorkerStatus.STARTING)
    started_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)


class AdapterRelease(Base):
    """One adapter version registered for a scenario: a candidate until it is promoted, and
    its answers on the scenario's gold set (run without touching stored results), so it is
    compared with the serving version on the same videos before it serves."""

    __tablename__ = "adapter_release"
    __table_args__ = (UniqueConstraint("scenario_id", "version"), _status_check("status", ReleaseStatus))

    id: Mapped[int] = mapped_column(primary_key=True)
    scenario_id: Mapped[int] = mapped_column(ForeignKey("scenario.id", ondelete="CASCADE"), index=True)
    version: Mapped[str] = mapped_column(String(64))  # content hash (vidlora.scenarios.adapter_version)
    path: Mapped[str] = mapped_column(String(1024))
    # The adapter scenarios.yaml named when this version was promoted: while the file still
    # names it the promotion stands; once the file names another, the file wins again.
    declared_path: Mapped[str | None] = mapped_column(String(1024))
    status: Mapped[str] = mapped_column(String(16), default=ReleaseStatus.CANDIDATE)
    # The release this one replaced when promoted: what ``rollback`` returns to.
    previous_id: Mapped[int | None] = mapped_column(ForeignKey("adapter_release.id", ondelete="SET NULL"))
    note: Mapped[str | None] = mapped_column(Text)
    # Result id (as text) -> the candidate's answer on that gold result: text, parsed, health.
    gold_answers: Mapped[dict[str, Any] | None] = mapped_column()
    gold_run_at: Mapped[datetime | None] = mapped_column(Timestamp)
    created_at: Mapped[datetime] = mapped_column(Timestamp, default=utcnow)
    promoted_at: Mapped[datetime | None] = mapped_column(Timestamp)
    # A promotion the gold-set check refused and a person forced (vidlora.feedback.gate): why
    # they did, and what the check had said, kept for whoever asks later why this version served.
    forced_reason: Mapped[str | None] = mapped_column(Text)
    forced_over: Mapped[str | None] = mapped_column(Text)

    scenario: Mapped[Scenario] = relationship()
