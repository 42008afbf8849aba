"""Resumable uploads over tus 1.0 (core, creation, termination, checksum) under /api/v1/uploads.

Who may call: the API's own authentication (an API token, what `vidlora upload` sends, or
the page's session with its CSRF token in the X-CSRFToken header, which tus-js-client sends as
a custom header). Discovery (OPTIONS) is public, as tus clients expect. A complete upload is
named in ``uploads`` when a batch is started (POST /api/v1/batches or the upload page), and from
there it is ingested like any upload. The protocol's state lives in ``vidlora.resumable``.
"""

from __future__ import annotations

import base64
import binascii

from flask import Response, current_app, jsonify, request
from werkzeug.exceptions import ClientDisconnected
from werkzeug.wsgi import get_input_stream

from vidlora import resumable
from vidlora.config import get_settings
from web.api import bp
from web.api.auth import api_user
from web.database import get_db

TUS_VERSION = "1.0.0"
EXTENSIONS = "creation,termination,checksum"
OFFSET_TYPE = "application/offset+octet-stream"
ENDPOINTS = {"api.tus_collection", "api.tus_upload"}
STATUS = {
    resumable.Refused: 400, resumable.NotFound: 404, resumable.OffsetMismatch: 409,
    resumable.TooLarge: 413, resumable.WrongType: 415, resumable.Busy: 423,
    resumable.ChecksumMismatch: 460, resumable.NoSpace: 507,
}
TITLES = {
    400: "Upload refused", 404: "No such upload", 409: "Wrong offset", 412: "Unsupported tus version",
    413: "Too large", 415: "Not a video or archive", 423: "Upload busy", 460: "Checksum mismatch",
    507: "Not enough space",
}


def _answer(status: int, detail: str | None = None, **headers: str | int) -> Response:
    response = (jsonify(error=TITLES.get(status, "Error"), detail=detail, status=status) if detail
                else Response(status=status))
    response.status_code = status
    response.headers["Tus-Resumable"] = TUS_VERSION
    response.headers["Cache-Control"] = "no-store"
    for name, value in headers.items():
        response.headers[name.replace("_", "-")] = str(value)
    return response


@bp.errorhandler(resumable.ResumableError)
def resumable_refused(exc: resumable.ResumableError):
    status = next(code for kind, code in STATUS.items() if isinstance(exc, kind))
    return _answer(status, str(exc))


@bp.before_request
def _tus_version():
    if request.endpoint not in ENDPOINTS or request.method == "OPTIONS":
        return None
    if request.headers.get("Tus-Resumable") != TUS_VERSION:
        return _answer(412, f"This server speaks tus {TUS_VERSION}: send the header Tus-Resumable: {TUS_VERSION}.",
                       Tus_Version=TUS_VERSION)
    return None


def _discovery() -> Response:
    settings = get_settings()
    return _answer(204, Tus_Version=TUS_VERSION, Tus_Extension=EXTENSIONS, Tus_Max_Size=settings.resumable_max_bytes,
                   Tus_Checksum_Algorithm=",".join(resumable.CHECKSUMS))


def _metadata(header: str) -> dict[str, str]:
    """``Upload-Metadata: filename ZmlsZS5tcDQ=,scenario YQ==`` -> {"filename": "file.mp4", ...}."""
    out: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in header.split(","))):
        key, _, value = pair.partition(" ")
        try:
            out[key] = base64.b64decode(value.strip(), validate=True).decode("utf-8") if value else ""
        except (binascii.Error, ValueError):
            raise resumable.Refused(f"Upload-Metadata's value for {key[:40]!r} is not base64 UTF-8 text.") from None
    return out


def _integer(name: str) -> int:
    raw = request.headers.get(name, "")
    if not raw.isdigit() or len(raw) > 19:
        raise resumable.Refused(f"{name} must be a whole number of bytes (got {raw[:30]!r}).")
    return int(raw)


@bp.route("/uploads", methods=["POST", "OPTIONS"], endpoint="tus_collection")
def create():
    if request.method == "OPTIONS":
        return _discovery()
    if "Upload-Defer-Length" in request.headers:
        raise resumable.Refused("Upload-Defer-Length is not supported: send the file's size as Upload-Length.")
    if request.content_length:
        raise resumable.Refused("Create the upload first, then send its bytes with PATCH (creation-with-upload "
                                "is not supported).")
    length = _integer("Upload-Length")
    meta = _metadata(request.headers.get("Upload-Metadata", ""))
    db = get_db()
    row = resumable.create(db, get_settings(), api_user().id, meta.get("filename", ""), length)
    db.commit()
    return _answer(201, Location=f"{request.path.rstrip('/')}/{row.key}", Upload_Offset=0)


@bp.route("/uploads/<key>", methods=["HEAD", "PATCH", "DELETE", "OPTIONS"], endpoint="tus_upload")
def upload(key: str):
    if request.method == "OPTIONS":
        return _discovery()
    if request.method == "HEAD":
        row = resumable.owned(get_db(), key, api_user().id)
        return _answer(200, Upload_Offset=row.offset, Upload_Length=row.length)
    if request.method == "DELETE":
        db = get_db()
        resumable.terminate(db, get_settings(), key, api_user().id)
        db.commit()
        return _answer(204)
    return _patch(key)


class _Body:
    """The request body in blocks, straight from the server's input (never Flask's form
    parsing or its whole-request size cap): b"" at the end or when the client went away."""

    def __init__(self) -> None:
        self.stream = get_input_stream(request.environ, safe_fallback=False, max_content_length=None)

    def read(self, size: int) -> bytes:
        try:
            return self.stream.read(size)
        except (ClientDisconnected, OSError, ValueError):
            current_app.logger.info("upload %s: the client went away mid-chunk", request.path)
            return b""


def _patch(key: str) -> Response:
    if request.mimetype != OFFSET_TYPE:
        return _answer(415, f"A chunk is sent as Content-Type: {OFFSET_TYPE}.")
    offset = _integer("Upload-Offset")
    checksum = resumable.parse_checksum(request.headers.get("Upload-Checksum"))
    # The session's connection is not held through a chunk that may take hours.
    get_db().close()
    progress = resumable.receive(get_settings(), key, api_user().id, offset, _Body().read,
                                 request.content_length, checksum)
    return _answer(204, Upload_Offset=progress.offset)
