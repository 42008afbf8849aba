"""Check an upload request and start its batch: shared by the upload page and the API."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone

from werkzeug.datastructures import FileStorage

from vidlora.batches import BatchError
from vidlora.config import get_settings
from vidlora.ingest.kinds import Kind, accepted_suffixes, kind_of
from tasks.submit import submit_received, submit_streams


class UploadError(ValueError):
    """A request people can fix: wrong file type, nothing chosen, unknown scenario."""


@dataclass
class UploadRequest:
    files: list[FileStorage]
    scenarios: list[str]
    name: str
    # Keys of complete resumable (tus) uploads, sent before the batch is asked for.
    received: list[str] = field(default_factory=list)


def allowed_suffixes() -> tuple[str, ...]:
    return accepted_suffixes(get_settings().video_extensions)


def client_name(filename: str) -> str:
    """The file's own name: browsers may send a path (old Windows ones a backslash path)."""
    return filename.replace("\\", "/").rsplit("/", 1)[-1].strip()


def is_allowed(filename: str) -> bool:
    return kind_of(client_name(filename), get_settings().video_extensions) != Kind.OTHER


def check(req: UploadRequest) -> None:
    if req.files and req.received:
        raise UploadError("Send files in the request or name resumable uploads, not both.")
    if req.received:
        if not req.scenarios:
            raise UploadError("Choose at least one scenario to run.")
        return  # each was checked by name and content when it was created
    if not req.files:
        raise UploadError("Choose at least one video, or one archive of videos.")
    bad = [client_name(f.filename or "") or "(no name)" for f in req.files if not is_allowed(f.filename or "")]
    if bad:
        kinds = ", ".join(allowed_suffixes())
        raise UploadError(f"Not a video or archive: {', '.join(bad)}. Accepted file types: {kinds}.")
    if not req.scenarios:
        raise UploadError("Choose at least one scenario to run.")


def default_name(files: list[FileStorage]) -> str:
    first = client_name(files[0].filename or "") if files else ""
    stamp = _stamp()
    if len(files) == 1 and first:
        return first
    return f"{first} and {len(files) - 1} more" if first else f"Upload {stamp}"


def start_batch(req: UploadRequest, source: str, created_by: str | None, user_id: int | None = None) -> int:
    """Validate, then park the files and send their ingest tasks. Returns the batch id."""
    check(req)
    if req.received:
        assert user_id is not None
        try:
            return submit_received(req.received, user_id, req.scenarios, req.name.strip() or f"Upload {_stamp()}",
                                   source=source, created_by=created_by)
        except BatchError as exc:
            raise UploadError(_capitalised(str(exc))) from exc
    streams = [(client_name(f.filename or ""), f.stream) for f in req.files]
    try:
        return submit_streams(streams, req.scenarios, req.name.strip() or default_name(req.files),
                              source=source, created_by=created_by)
    except BatchError as exc:
        raise UploadError(_capitalised(str(exc))) from exc


def from_request(files: list[FileStorage], scenarios: list[str], name: str | None,
                 received: list[str] | None = None) -> UploadRequest:
    chosen = [f for f in files if f is not None and (f.filename or "").strip()]
    keys = [k.strip() for k in received or [] if k and k.strip()]
    return UploadRequest(chosen, [s for s in scenarios if s], (name or "")[:255], keys)


def _stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")


def _capitalised(text: str) -> str:
    return text[:1].upper() + text[1:] if text else text
