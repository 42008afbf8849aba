"""Names as people type them (vidlora.names): a Mac's decomposed (NFD) file name and a composed
(NFC) one are one name: stored once in NFC (a second file of that name is numbered, as any
namesake), shown as typed, and found by a search typed in either form. Through the real ingest
task and the API a script searches with."""

from __future__ import annotations

import io
import unicodedata

import pytest
from sqlalchemy import select, update

from tasks.ingest import ingest_upload
from tests.support.archives import zip_bytes
from tests.support.fault_media import tiny_clips
from vidlora.batches import create_batch, park_stream
from vidlora.config import get_settings
from vidlora.db import session_scope
from vidlora.models import Analysis, BatchItem, Result, Video, utcnow

NAME = "Grabkammer_Süd_Ölgefäß.mp4"
NFC, NFD = unicodedata.normalize("NFC", NAME), unicodedata.normalize("NFD", NAME)


@pytest.fixture()
def token(reviewer) -> dict[str, str]:
    from web.auth.tokens import create_token
    from web.auth.users import get_user

    with session_scope() as session:
        return {"Authorization": "Bearer " + create_token(session, get_user(session, reviewer), "names", "read").token}


def test_nfd_and_nfc_names_are_one_name_and_a_search_finds_both(client, token, corpus_dir):
    assert NFC != NFD
    clips = tiny_clips(corpus_dir / "web-names", 3, size="56x40")  # not another test's clips: its own videos
    data = zip_bytes([(NFC, clips[0].read_bytes()), (NFD, clips[1].read_bytes()),
                 (unicodedata.normalize("NFD", "Ölgefäß_Nord.mp4"), clips[2].read_bytes())])
    with session_scope() as session:
        batch = create_batch(session, unicodedata.normalize("NFD", "Süd-Grabung"), "cli", ["artifact_identification"])
        upload = park_stream(session, get_settings(), batch, "mac.zip", io.BytesIO(data), 1 << 30)
        batch_id, upload_id = batch.id, upload.id
        assert batch.name == "Süd-Grabung" == unicodedata.normalize("NFC", batch.name)
    assert ingest_upload(upload_id)["stored"] == 3
    with session_scope() as session:
        items = session.scalars(select(BatchItem).where(BatchItem.batch_id == batch_id).order_by(BatchItem.id)).all()
        names = [i.name for i in items]
        assert all(unicodedata.is_normalized("NFC", n) for n in names), names
        # One name, two files: the second is numbered like any namesake, never a look-alike twin.
        assert names[0] == NFC and names[1] == NFC.replace(".mp4", " (2).mp4") and "renamed" in items[1].reason
        for item in items:  # each analysis answers, as the worker would leave it
            video = session.get(Video, item.video_id)
            assert unicodedata.is_normalized("NFC", video.original_name)
            for analysis in session.scalars(select(Analysis).where(Analysis.video_id == video.id)):
                session.add(Result(analysis_id=analysis.id, text="Ein Ölgefäß.", prompt_tokens=1, output_tokens=1,
                                   latency_s=1.0, model="tiny"))
        session.execute(update(Analysis).where(Analysis.batch_id == batch_id).values(status="done", finished_at=utcnow()))
    for typed in ("Ölgefäß", unicodedata.normalize("NFD", "Ölgefäß")):
        found = client.get("/api/v1/results", query_string={"q": typed, "batch": batch_id}, headers=token)
        assert found.status_code == 200, found.get_data(as_text=True)
        assert found.json["total"] == 3, (ascii(typed), found.json["total"])
