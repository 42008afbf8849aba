"""`vidlora upload URL FILES... -s SCENARIO`: send footage to a remote vidlora over tus.

Each file goes in chunks (tuspy, the tus protocol's Python client), each chunk with its
sha256 in Upload-Checksum, so the server keeps only bytes that arrived intact. The upload URL
of every file is kept under the user's cache folder by the file's fingerprint: a run that was
killed, or lost its connection, resumes each file from the offset the server holds. Once
every file is complete, one batch is started from them (POST /api/v1/batches), ingested there
like any upload.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import IO

import click

from vidlora.config import get_settings
from vidlora.ingest.kinds import Kind, kind_of, not_video_reason

TIMEOUT_S = 60
FINGERPRINT_BYTES = 1024 * 1024


class _Fingerprint:
    """A file's identity for resuming: its size and modification time with its first and last
    MiB (tuspy's own reads only the first 64 KiB, which camera files of one day may share),
    and where it goes."""

    def __init__(self, path: Path, endpoint: str) -> None:
        self.path, self.endpoint = path, endpoint

    def get_fingerprint(self, fs: IO) -> str:
        st = os.stat(self.path)
        digest = hashlib.sha256(f"{self.endpoint}\0{self.path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode())
        fs.seek(0)
        digest.update(fs.read(FINGERPRINT_BYTES))
        fs.seek(max(0, st.st_size - FINGERPRINT_BYTES))
        digest.update(fs.read(FINGERPRINT_BYTES))
        return digest.hexdigest()


# What a refusal without a body (an answer to HEAD) means.
BODILESS = {401: "the server does not accept this API token (unknown, revoked, or its account is deactivated)",
            403: "this API token may not upload: it needs scope review"}


def _refusal(exc: Exception) -> str:
    body = getattr(exc, "response_content", None) or b""
    if not body and getattr(exc, "status_code", None) in BODILESS:
        return BODILESS[exc.status_code]
    try:
        import json

        return json.loads(body)["detail"]
    except (ValueError, KeyError, TypeError):
        status = getattr(exc, "status_code", None)
        return f"{exc} (HTTP {status})" if status else str(exc)


def _uploader(client, path: Path, endpoint: str, storage, chunk_bytes: int):
    from tusclient.exceptions import TusCommunicationError
    from tusclient.uploader import Uploader

    class Sha256Uploader(Uploader):
        CHECKSUM_ALGORITHM_PAIR = ("sha256", hashlib.sha256)

        def _retry_or_cry(self, error):
            # A refusal (4xx) is final: retrying a wrong type or a revoked token only waits.
            # A wrong offset (409) or a busy upload (423) is retried from the server's offset.
            status = getattr(error, "status_code", None)
            if status is not None and 400 <= status < 500 and status not in (409, 423):
                raise error
            super()._retry_or_cry(error)

    def make():
        return Sha256Uploader(file_path=str(path), client=client, chunk_size=chunk_bytes, metadata={"filename": path.name},
                              retries=8, retry_delay=3, store_url=True, url_storage=storage,
                              fingerprinter=_Fingerprint(path, endpoint), upload_checksum=True)

    try:
        return make()
    except TusCommunicationError as exc:
        if exc.status_code is None:
            raise click.ClickException(f"{path.name}: cannot reach the server ({exc}); run the same command "
                                       "again to resume") from exc
        if exc.status_code not in (404, 410):
            raise click.ClickException(f"{path.name}: {_refusal(exc)}") from exc
        # The URL kept from an earlier run is gone on the server (expired, or used): start anew.
        storage.remove_item(_fingerprint(path, endpoint))
        return make()


def _fingerprint(path: Path, endpoint: str) -> str:
    with path.open("rb") as fh:
        return _Fingerprint(path, endpoint).get_fingerprint(fh)


def send(base_url: str, paths: list[Path], scenarios: list[str], name: str | None, token: str,
         chunk_bytes: int) -> dict:
    """Upload every file resumably, then start their batch; returns the server's answer."""
    import requests
    from tusclient import client as tus
    from tusclient.exceptions import TusCommunicationError
    from tusclient.storage.filestorage import FileStorage

    settings = get_settings()
    assert settings.upload_cache_dir is not None
    settings.upload_cache_dir.mkdir(parents=True, exist_ok=True)
    base = base_url.rstrip("/")
    endpoint = f"{base}/api/v1/uploads"
    headers = {"Authorization": f"Bearer {token}"}
    storage = FileStorage(str(settings.upload_cache_dir / "uploads.json"))
    keys = []
    try:
        for path in paths:
            uploader = _uploader(tus.TusClient(endpoint, headers=headers), path, endpoint, storage, chunk_bytes)
            if uploader.offset:
                click.echo(f"{path.name}: resuming at {uploader.offset} of {uploader.stop_at} bytes", err=True)
            shown = -1
            try:
                while uploader.offset < uploader.stop_at or not uploader.url:
                    uploader.upload_chunk()
                    percent = 100 * uploader.offset // max(1, uploader.stop_at)
                    if percent != shown:  # at most a line per percent of a long file
                        shown = percent
                        click.echo(f"{path.name}: {uploader.offset} of {uploader.stop_at} bytes", err=True)
            except TusCommunicationError as exc:
                again = "" if exc.status_code else "; run the same command again to resume"
                raise click.ClickException(f"{path.name}: {_refusal(exc)}{again}") from exc
            keys.append((path, uploader.url.rstrip("/").rsplit("/", 1)[-1]))
        answer = requests.post(f"{base}/api/v1/batches", headers=headers, timeout=TIMEOUT_S, data={
            "uploads": [k for _, k in keys], "scenarios": scenarios, "name": name or paths[0].name})
        body = answer.json() if answer.headers.get("Content-Type", "").startswith("application/json") else {}
        if answer.status_code != 201:
            raise click.ClickException(body.get("detail") or f"the batch was refused (HTTP {answer.status_code})")
        for path, _ in keys:  # used: a later run of the same file is a new upload
            storage.remove_item(_fingerprint(path, endpoint))
        return body
    finally:
        storage.close()


@click.command("upload")
@click.argument("url")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--scenario", "-s", "scenarios", multiple=True, required=True, help="Scenario name (repeatable).")
@click.option("--name", default=None, help="Batch name (default: the first file's name).")
@click.option("--token", default=None, help="API token (default: VIDLORA_API_TOKEN).")
@click.option("--chunk-mb", default=8, show_default=True, type=click.IntRange(1, 4096),
              help="MiB per request; a dropped connection re-sends at most one chunk.")
def upload_command(url: str, files: tuple[Path, ...], scenarios: tuple[str, ...], name: str | None,
                   token: str | None, chunk_mb: int) -> None:
    """Send videos and archives to the vidlora at URL, resumably: run it again after a cut or
    a kill and each file continues from the last byte the server has."""
    settings = get_settings()
    token = token or settings.api_token
    if not token:
        raise click.ClickException("an API token is needed: --token, or VIDLORA_API_TOKEN "
                                   "(an admin makes one with `vidlora token create USER --name NAME --scope review`)")
    bad = [f"{p.name}: {not_video_reason(p.name)}" for p in files if kind_of(p.name, settings.video_extensions) == Kind.OTHER]
    if bad:
        raise click.ClickException("; ".join(bad))
    body = send(url, list(files), list(scenarios), name, token, chunk_mb * 1024 * 1024)
    click.echo(f"batch {body['batch_id']}: {len(files)} file(s) uploaded; {url.rstrip('/')}{body.get('page', '')}")
