"""migrations/: `alembic upgrade head` on an empty database matches the models exactly."""

import json
import os
import subprocess
import sys
import uuid

import pytest
from sqlalchemy import create_engine, inspect, make_url, text

from tests.support.env import ROOT


def alembic(url: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "VIDLORA_DATABASE_URL": url}
    return subprocess.run([sys.executable, "-m", "alembic", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture()
def empty_pg():
    from tests.support.env import PG_ADMIN_URL

    name = f"vidlora_mig_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    admin.dispose()


def test_upgrade_head_then_check_reports_no_drift(empty_pg):
    up = alembic(empty_pg, "upgrade", "head")
    assert up.returncode == 0, up.stderr
    check = alembic(empty_pg, "check")
    assert check.returncode == 0, check.stdout + check.stderr
    engine = create_engine(empty_pg)
    insp = inspect(engine)
    assert {"video", "analysis", "result", "frame_set", "review", "worker"} <= set(insp.get_table_names())
    # Constraints carry our names, so later migrations can alter them.
    assert any(c["name"] == "uq_analysis_video_id_scenario_id" for c in insp.get_unique_constraints("analysis"))
    assert "ix_result_fts" in {i["name"] for i in insp.get_indexes("result")}
    engine.dispose()


def test_downgrade_to_base_leaves_an_empty_schema(empty_pg):
    assert alembic(empty_pg, "upgrade", "head").returncode == 0
    down = alembic(empty_pg, "downgrade", "base")
    assert down.returncode == 0, down.stderr
    engine = create_engine(empty_pg)
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    engine.dispose()


def test_sqlite_embedded_database_migrates_too(tmp_path):
    url = f"sqlite:///{tmp_path / 'v.db'}"
    assert alembic(url, "upgrade", "head").returncode == 0
    check = alembic(url, "check")
    assert check.returncode == 0, check.stdout + check.stderr


def _one_analysis(conn) -> None:
    """A scenario, a video and its done analysis (ids 1), as an older schema holds them."""
    conn.execute(text("INSERT INTO scenario (name, title, description, prompt, sampling, generation, active, "
                      "adapter_status, created_at, updated_at) VALUES ('s', 'S', '', 'p', '{}', '{}', true, "
                      "'none', now(), now())"))
    conn.execute(text("INSERT INTO video (sha256, path, original_name, size_bytes, status, attempts, created_at, "
                      "updated_at) VALUES ('h', 'v', 'v.mp4', 1, 'ready', 0, now(), now())"))
    conn.execute(text("INSERT INTO analysis (video_id, scenario_id, status, attempts, created_at) "
                      "VALUES (1, 1, 'done', 1, now())"))


def test_0004_keeps_stored_answers_and_indexes_their_fields(empty_pg):
    """Results stored before structured results became data: their answers move to JSONB
    unchanged and their fields are indexed; downgrading gives the JSON column back."""
    assert alembic(empty_pg, "upgrade", "0003").returncode == 0
    engine = create_engine(empty_pg)
    answer = {"finds": [{"material": "bronze", "confidence": 0.5}, {"material": "jade"}], "sealed": True}
    with engine.begin() as conn:
        _one_analysis(conn)
        conn.execute(text("INSERT INTO result (analysis_id, text, parsed, prompt_tokens, output_tokens, latency_s, "
                          "health, model, review_state, created_at) VALUES (1, 'x', CAST(:p AS json), 1, 1, 0.1, "
                          "'{}', 'm', 'unreviewed', now())"), {"p": json.dumps(answer)})
    up = alembic(empty_pg, "upgrade", "head")
    assert up.returncode == 0, up.stderr
    with engine.connect() as conn:
        assert conn.execute(text("SELECT pg_typeof(parsed)::text, parsed FROM result")).one() == ("jsonb", answer)
        fields = conn.execute(text("SELECT path, item, text, num FROM result_field ORDER BY item, path")).all()
    assert [tuple(f) for f in fields] == [("finds.confidence", 0, None, 0.5), ("finds.material", 0, "bronze", None),
                                          ("finds.material", 1, "jade", None), ("sealed", None, "true", None)]
    down = alembic(empty_pg, "downgrade", "0003")
    assert down.returncode == 0, down.stderr
    with engine.connect() as conn:
        assert conn.execute(text("SELECT pg_typeof(parsed)::text FROM result")).scalar() == "json"
    engine.dispose()


def test_0017_indexes_file_and_member_names_for_the_search_box_on_postgresql(empty_pg):
    """The search box matches any part of a name (ILIKE '%word%'): trigram indexes answer that
    without reading every name; downgrading drops them."""
    assert alembic(empty_pg, "upgrade", "head").returncode == 0
    engine = create_engine(empty_pg)
    with engine.connect() as conn:
        indexes = dict(conn.execute(text("SELECT indexname, indexdef FROM pg_indexes "
                                         "WHERE indexname LIKE '%trgm'")).all())
    assert set(indexes) == {"ix_video_original_name_trgm", "ix_batch_item_name_trgm"}
    assert all("gin_trgm_ops" in d for d in indexes.values())
    assert alembic(empty_pg, "downgrade", "0016").returncode == 0
    with engine.connect() as conn:
        assert not conn.execute(text("SELECT indexname FROM pg_indexes WHERE indexname LIKE '%trgm'")).all()
    engine.dispose()


def _head() -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(Config(str(ROOT / "alembic.ini"))).get_current_head()


def test_0017_without_the_right_to_create_pg_trgm_upgrades_and_says_how_to_index_later(empty_pg):
    """A managed server whose application role may not create extensions: the upgrade goes on
    (search works, reading every name), and the log says what a superuser runs."""
    role = f"vl_noext_{uuid.uuid4().hex[:6]}"
    admin = create_engine(empty_pg, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE ROLE {role} LOGIN"))
        conn.execute(text(f"GRANT ALL ON SCHEMA public TO {role}"))
    url = make_url(empty_pg).set(username=role, password=None).render_as_string(hide_password=False)
    try:
        up = alembic(url, "upgrade", "head")
        assert up.returncode == 0, up.stderr
        assert "pg_trgm unavailable" in up.stderr and "CREATE INDEX ix_video_original_name_trgm" in up.stderr
        with admin.connect() as conn:
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == _head()
            assert not conn.execute(text("SELECT indexname FROM pg_indexes WHERE indexname LIKE '%trgm'")).all()
    finally:
        with admin.connect() as conn:
            conn.execute(text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
            conn.execute(text(f"DROP ROLE {role}"))
        admin.dispose()


def test_0018_marks_a_value_a_result_repeats_and_indexes_the_reviewed_results(empty_pg):
    """Facets count a result once per value without DISTINCT: rows stored before 0018 that
    repeat an earlier row's path and value in the same result are marked; the reviewed
    results get their partial index. Downgrading takes both away."""
    assert alembic(empty_pg, "upgrade", "0017").returncode == 0
    engine = create_engine(empty_pg)
    with engine.begin() as conn:
        _one_analysis(conn)
        conn.execute(text("INSERT INTO result (analysis_id, text, parsed, prompt_tokens, output_tokens, latency_s, "
                          "health, model, review_state, created_at) VALUES (1, 'x', '{}', 1, 1, 0.1, "
                          "'{}', 'm', 'unreviewed', now())"))
        conn.execute(text("INSERT INTO result_field (result_id, path, item, text, num) VALUES "
                          "(1, 'finds.material', 0, 'bronze', NULL), (1, 'finds.material', 1, 'jade', NULL), "
                          "(1, 'finds.material', 2, 'bronze', NULL), (1, 'finds.confidence', 0, NULL, 0.5), "
                          "(1, 'finds.confidence', 1, NULL, 0.5), (1, 'sealed', NULL, 'true', NULL)"))
    up = alembic(empty_pg, "upgrade", "head")
    assert up.returncode == 0, up.stderr
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT path, item, repeat FROM result_field ORDER BY path, item")).all()
        index = conn.execute(text("SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_result_reviewed'")).scalar()
    assert [tuple(r) for r in rows] == [("finds.confidence", 0, False), ("finds.confidence", 1, True),
                                        ("finds.material", 0, False), ("finds.material", 1, False),
                                        ("finds.material", 2, True), ("sealed", None, False)]
    assert "WHERE" in index and "unreviewed" in index
    down = alembic(empty_pg, "downgrade", "0017")
    assert down.returncode == 0, down.stderr
    with engine.connect() as conn:
        assert not conn.execute(text("SELECT 1 FROM pg_indexes WHERE indexname = 'ix_result_reviewed'")).all()
        assert "repeat" not in {c for (c,) in conn.execute(text(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'result_field'"))}
    engine.dispose()
