"""Web fixtures: the app on the session's PostgreSQL database, signed-in clients, and
factories that insert batches, videos, frame sets (real small JPEGs in the media store),
analyses and results directly through the models."""

from __future__ import annotations

import io
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from PIL import Image

from vidlora.config import get_settings
from vidlora.db import session_scope
from tests.support.web import PASSWORD, csrf_token, login
from vidlora.models import Analysis, Batch, BatchItem, FrameSet, Result, Scenario, User, Video, Worker, utcnow

SCENARIOS = ("artifact_identification", "tomb_structure", "murals_inscriptions")


@pytest.fixture(scope="session")
def app(database, broker):
    from web import create_app

    return create_app({"TESTING": True, "SECRET_KEY": "test-secret-key"})


@pytest.fixture()
def client(app):
    return app.test_client()


@pytest.fixture(scope="session")
def reviewer(database) -> str:
    from web.auth.users import create_user

    with session_scope() as session:
        create_user(session, "reviewer", PASSWORD)
    return "reviewer"


@pytest.fixture()
def logged_in_client(client, reviewer):
    response = login(client, reviewer)
    assert response.status_code == 302, response.get_data(as_text=True)
    client.csrf = csrf_token(client)  # the token of the signed-in session
    return client


def jpeg_bytes(colour: tuple[int, int, int] = (150, 90, 40), size: tuple[int, int] = (64, 36)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, "JPEG", quality=80)
    return out.getvalue()


@dataclass
class Made:
    batch_id: int
    video_id: int
    frame_set_id: int
    analysis_ids: dict[str, int]
    result_ids: dict[str, int]


class Factory:
    """Inserts rows the way the pipeline would leave them; every call makes unique content."""

    def __init__(self, media_root: Path):
        self.media_root = media_root

    def scenario_id(self, session, name: str) -> int:
        return session.query(Scenario.id).filter(Scenario.name == name).scalar()

    def video(self, session, name: str = "trench.mp4", frames: int = 4, video_bytes: bytes | None = None) -> tuple[Video, FrameSet]:
        key = uuid.uuid4().hex
        rel_video = f"videos/{key[:2]}/{key}.mp4"
        (self.media_root / rel_video).parent.mkdir(parents=True, exist_ok=True)
        (self.media_root / rel_video).write_bytes(video_bytes or (b"\x00\x00\x00\x18ftypmp42" + key.encode() * 64))
        video = Video(sha256=key + key[:32], path=rel_video, original_name=name, size_bytes=1234, status="ready",
                      container="mp4", codec="h264", width=64, height=36, fps=25.0, duration_s=12.5, frame_count=312)
        session.add(video)
        session.flush()
        files = []
        frame_dir = self.media_root / "frames" / key
        frame_dir.mkdir(parents=True, exist_ok=True)
        for i in range(frames):
            (frame_dir / f"{i:04d}.jpg").write_bytes(jpeg_bytes((40 * i % 255, 90, 40)))
            files.append(f"frames/{key}/{i:04d}.jpg")
        frame_set = FrameSet(video_id=video.id, policy_key=f"uniform-{frames}", policy={"mode": "uniform"}, status="done",
                             timestamps=[round(i * 12.5 / max(frames, 1), 2) for i in range(frames)], files=files,
                             width=64, height=36, backend="test")
        session.add(frame_set)
        session.flush()
        return video, frame_set

    def batch(self, texts: dict[str, str | None] | None = None, name: str = "Trench 4", video_name: str = "trench.mp4",
              statuses: dict[str, str] | None = None, review_state: str = "unreviewed") -> Made:
        """A batch with one video; per scenario a result text (None: no result)."""
        texts = texts if texts is not None else {"artifact_identification": "A bronze fibula with incised decoration."}
        statuses = statuses or {}
        with session_scope() as session:
            batch = Batch(name=name, source="web", scenario_names=list(texts), status="ingested", created_by="reviewer")
            session.add(batch)
            session.flush()
            video, frame_set = self.video(session, video_name)
            session.add(BatchItem(batch_id=batch.id, name=video_name, status="stored", video_id=video.id))
            analysis_ids, result_ids = {}, {}
            for scenario, text in texts.items():
                status = statuses.get(scenario, "done" if text is not None else "running")
                analysis = Analysis(video_id=video.id, scenario_id=self.scenario_id(session, scenario), batch_id=batch.id,
                                    frame_set_id=frame_set.id, status=status, attempts=1, adapter_version="abc123def456",
                                    reason="decoder gave up" if status == "failed" else None,
                                    finished_at=utcnow() if status in ("done", "failed") else None)
                session.add(analysis)
                session.flush()
                analysis_ids[scenario] = analysis.id
                if text is not None:
                    result = Result(analysis_id=analysis.id, text=text, prompt_tokens=1200, output_tokens=48,
                                    latency_s=1.25, finish_reason="stop",
                                    health={"ok": True, "schema_ok": True,
                                            "checks": {"logprobs_finite": True, "all_bang": False, "top_token_frac": 0.12}},
                                    model="tiny-qwen", adapter=scenario, adapter_version="abc123def456",
                                    review_state=review_state)
                    session.add(result)
                    session.flush()
                    result_ids[scenario] = result.id
            return Made(batch.id, video.id, frame_set.id, analysis_ids, result_ids)


@pytest.fixture(scope="session")
def factory(database) -> Factory:
    root = Path(get_settings().media_root)
    root.mkdir(parents=True, exist_ok=True)
    return Factory(root)


@pytest.fixture()
def reviewer_id(reviewer) -> int:
    with session_scope() as session:
        return session.query(User.id).filter(User.username == reviewer).scalar()


@pytest.fixture()
def make_worker(database):
    """A GPU worker heartbeat row (unique name per test), ``age_s`` seconds old."""
    from datetime import timedelta

    def make(name: str, adapters: list[str], age_s: float = 1.0, status: str = "ready") -> None:
        with session_scope() as session:
            session.query(Worker).filter(Worker.name == name).delete()
            session.add(Worker(
                name=name, queue=f"gpu.{name}", device="NVIDIA H200", status=status,
                versions={"vllm": "0.11", "torch": "2.8"}, adapters_resident=adapters, adapter_loads=len(adapters),
                last_canary={"ok": True, "latency_s": 0.4}, heartbeat_at=utcnow() - timedelta(seconds=age_s),
            ))

    return make
