"""Every state a row can be in, and the moves between them, defined once.

The database's CHECK constraints, the tasks that move rows, the reconciler, the audit, the
CLI and the pages all name states from here. Members are ``StrEnum``s: they are stored, sent
and compared as their plain string values ("done"), so rows, JSON and query strings keep
the same text as before.

An analysis moves only along ``ANALYSIS_MOVES``; the model checks every assignment
(`vidlora.models.Analysis`), so a finished analysis is never set back to work by a late or
duplicated message, whichever code path tries.
"""
from __future__ import annotations

from enum import StrEnum


class BatchStatus(StrEnum):
    INGESTING = "ingesting"  # uploads not yet unpacked into videos
    INGESTED = "ingested"
    FAILED = "failed"


class UploadStatus(StrEnum):
    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"


class ResumableStatus(StrEnum):
    """A resumable (tus) upload: bytes arriving, all bytes here, or handed to a batch."""
    RECEIVING = "receiving"
    COMPLETE = "complete"
    SUBMITTED = "submitted"


class ItemStatus(StrEnum):
    """What became of one member of a batch."""
    STORED = "stored"
    REJECTED = "rejected"
    SKIPPED = "skipped"


class VideoStatus(StrEnum):
    REGISTERED = "registered"  # stored, not yet probed
    PROBING = "probing"
    READY = "ready"  # probed and accepted: its frames can be sampled
    REJECTED = "rejected"  # the input's fault (not a video, truncated, ...): never retried
    FAILED = "failed"  # ours (gave up after the attempt cap)


class FrameSetStatus(StrEnum):
    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"


class AnalysisStatus(StrEnum):
    PENDING = "pending"  # waiting for frames
    READY = "ready"  # frames done, waiting for dispatch
    QUEUED = "queued"  # in a GPU batch message
    RUNNING = "running"  # the engine has it
    DONE = "done"
    FAILED = "failed"
    REJECTED = "rejected"  # its video (or its frames) could not be analysed


class ReviewState(StrEnum):
    UNREVIEWED = "unreviewed"
    APPROVED = "approved"
    REJECTED = "rejected"
    EDITED = "edited"


class Role(StrEnum):
    REVIEWER = "reviewer"  # review, upload, export, their own API tokens
    ADMIN = "admin"  # and accounts: list, deactivate, reset, roles


class TokenScope(StrEnum):
    READ = "read"  # GET only: batches, results, exports
    REVIEW = "review"  # read, plus submitting batches and reviews


class ReviewAction(StrEnum):
    APPROVE = "approve"
    REJECT = "reject"
    EDIT = "edit"
    NOTE = "note"


class AdapterStatus(StrEnum):
    UNCHECKED = "unchecked"
    OK = "ok"
    REFUSED = "refused"  # a GPU worker would not serve it; its analyses fail with the reason
    NONE = "none"  # the scenario runs on the base model


class ReleaseStatus(StrEnum):
    """An adapter version registered for a scenario (vidlora.feedback.releases)."""
    CANDIDATE = "candidate"  # tested on the gold set, not serving
    SERVING = "serving"  # promoted: new analyses of the scenario run with it
    RETIRED = "retired"  # served before, replaced by a promotion or a rollback


class WorkerStatus(StrEnum):
    STARTING = "starting"
    READY = "ready"
    STOPPED = "stopped"


FINAL_ANALYSIS = frozenset({AnalysisStatus.DONE, AnalysisStatus.FAILED, AnalysisStatus.REJECTED})
IN_FLIGHT_ANALYSIS = frozenset({AnalysisStatus.QUEUED, AnalysisStatus.RUNNING})
# A video no task will touch again (accepted videos are "settled" once probed).
SETTLED_VIDEO = frozenset({VideoStatus.READY, VideoStatus.REJECTED, VideoStatus.FAILED})
UNPROBED_VIDEO = frozenset({VideoStatus.REGISTERED, VideoStatus.PROBING})
BAD_VIDEO = frozenset({VideoStatus.REJECTED, VideoStatus.FAILED})

_A = AnalysisStatus
ANALYSIS_MOVES: dict[AnalysisStatus, frozenset[AnalysisStatus]] = {
    _A.PENDING: frozenset({_A.READY, _A.REJECTED, _A.FAILED}),
    _A.READY: frozenset({_A.QUEUED, _A.FAILED, _A.REJECTED}),
    # queued/running go back to ready when their message or worker was lost, or the engine
    # gave the batch back; the attempt cap ends that loop in failed.
    _A.QUEUED: frozenset({_A.RUNNING, _A.READY, _A.FAILED, _A.REJECTED}),
    _A.RUNNING: frozenset({_A.DONE, _A.FAILED, _A.READY, _A.REJECTED}),
    _A.DONE: frozenset(),
    _A.FAILED: frozenset(),
    _A.REJECTED: frozenset(),
}


class IllegalMove(ValueError):
    """A row was told to move where its lifecycle does not go (a bug, or a stale message)."""


def check_analysis_move(old: str | None, new: str) -> AnalysisStatus:
    """``new`` as a member, if an analysis in ``old`` (None: a new row) may move there."""
    target = AnalysisStatus(new)
    if old is None or old == target or target in ANALYSIS_MOVES[AnalysisStatus(old)]:
        return target
    raise IllegalMove(f"analysis cannot move from {old} to {target}")


def values(states: type[StrEnum]) -> tuple[str, ...]:
    """The plain values, in definition order (CHECK constraints, forms, the API schema)."""
    return tuple(s.value for s in states)
