"""migrations/: `alembic upgrade head` on an empty database matches the models exactly."""

import os
import subprocess
import sys
import uuid

import pytest
from sqlalchemy import create_engine, inspect, text

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
