"""cli.doctor and vidlora.audit against the real test database and Redis."""

from pathlib import Path

from sqlalchemy import select

from vidlora.db import session_scope

from vidlora.audit import audit
from vidlora.config import get_settings
from cli.doctor import run_checks


def test_doctor_sees_the_database_broker_and_media(database, broker):
    # Behind a proxy, the doctor also says whether anything bypassed it (tests/web/test_proxy.py).
    checks = {c.name: c for c in run_checks(get_settings().model_copy(update={"proxy_hops": 1}))}
    assert checks["proxy"].ok and "no request has bypassed the proxy" in checks["proxy"].detail
    assert checks["database"].ok and checks["migrations"].ok and checks["durable commits"].ok
    assert checks["broker"].ok and "queues" in checks["broker"].detail
    assert checks["media store"].ok and checks["ffmpeg"].ok
    # Every failing check says how to fix it.
    assert all(c.fix for c in checks.values() if not c.ok)


def test_doctor_flags_a_database_that_acknowledges_commits_before_writing_them(database):
    from sqlalchemy import create_engine, text

    from vidlora.config import Settings

    # The setting is per database: turn it off on a scratch database, not the shared one.
    admin = create_engine(database.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT")
    name = database.rsplit("/", 1)[1] + "_async"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
        conn.execute(text(f'ALTER DATABASE "{name}" SET synchronous_commit = off'))
    try:
        checks = {c.name: c for c in run_checks(Settings(database_url=database.rsplit("/", 1)[0] + "/" + name))}
        assert not checks["durable commits"].ok and "synchronous_commit = on" in checks["durable commits"].fix
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_doctor_reports_a_missing_database_with_a_fix():
    from vidlora.config import Settings

    bad = Settings(database_url="postgresql+psycopg://nobody@127.0.0.1:1/none")
    checks = run_checks(bad)
    assert not checks[0].ok and "VIDLORA_DATABASE_URL" in checks[0].fix


def test_audit_flags_a_stuck_analysis_and_a_result_without_health(db_session):
    from vidlora.models import Analysis, Batch, BatchItem, Result, Scenario, Video

    scenario = db_session.scalar(select(Scenario).limit(1))
    batch = Batch(name="audit", source="cli", scenario_names=[scenario.name])
    video = Video(sha256="f" * 64, path="videos/x.mp4", original_name="x.mp4", size_bytes=1, status="ready")
    db_session.add_all([batch, video])
    db_session.flush()
    db_session.add(BatchItem(batch_id=batch.id, name="x.mp4", status="stored", video_id=video.id))
    stuck = Analysis(video_id=video.id, scenario_id=scenario.id, status="running")
    db_session.add(stuck)
    db_session.flush()
    report = audit(db_session, [batch.id])
    assert report.stuck_analyses == [stuck.id] and not report.clean
    stuck.status = "done"
    db_session.add(Result(analysis_id=stuck.id, text="t", prompt_tokens=1, output_tokens=1, latency_s=0.1,
                          health={}, model="m"))
    db_session.flush()
    db_session.expire_all()
    report = audit(db_session, [batch.id])
    assert report.stuck_analyses == [] and len(report.unchecked_results) == 1


def test_audit_counts_a_stored_video_without_its_analysis_as_lost(db_session):
    from vidlora.models import Analysis, Batch, BatchItem, Scenario, Video

    first, second = db_session.scalars(select(Scenario).order_by(Scenario.id).limit(2)).all()
    batch = Batch(name="audit-lost", source="cli", scenario_names=[first.name, second.name])
    video = Video(sha256="e" * 64, path="videos/y.mp4", original_name="y.mp4", size_bytes=1, status="ready")
    db_session.add_all([batch, video])
    db_session.flush()
    db_session.add(BatchItem(batch_id=batch.id, name="y.mp4", status="stored", video_id=video.id))
    db_session.add(Analysis(video_id=video.id, scenario_id=first.id, status="rejected", reason="r"))
    db_session.flush()
    assert audit(db_session, [batch.id]).lost_videos == ["analyses-of:y.mp4"]
    # The missing scenario's analysis may come from another batch with the same content.
    db_session.add(Analysis(video_id=video.id, scenario_id=second.id, status="rejected", reason="r"))
    db_session.flush()
    assert audit(db_session, [batch.id]).lost_videos == []


def test_doctor_runs_the_workers_registration_on_each_adapter(database, tmp_path):
    """An adapter the GPU workers would refuse is flagged with the module and why, by the same
    registration they run (engine_patch.registration), before any worker starts."""
    import json
    import shutil

    from sqlalchemy import select

    from tests.support.tiny import tiny_model
    from vidlora.config import get_settings
    from cli.doctor import run_checks
    from vidlora.models import Scenario

    settings = get_settings()
    src = Path(settings.adapter_root) / "tomb_structure"
    bad = tmp_path / "dora"
    shutil.copytree(src, bad)
    cfg = json.loads((bad / "adapter_config.json").read_text())
    (bad / "adapter_config.json").write_text(json.dumps({**cfg, "use_dora": True}))
    assert tiny_model()
    with session_scope() as session:
        row = session.scalar(select(Scenario).where(Scenario.name == "tomb_structure"))
        path, row.adapter_path = row.adapter_path, str(bad)
    try:
        checks = {c.name: c for c in run_checks(settings)}
        assert checks["adapter artifact_identification"].ok
        tomb = checks["adapter tomb_structure"]
        assert not tomb.ok and "use_dora" in tomb.detail and "DoRA" in tomb.detail and tomb.fix
    finally:
        with session_scope() as session:
            session.scalar(select(Scenario).where(Scenario.name == "tomb_structure")).adapter_path = path


def test_doctor_says_when_the_cache_not_max_num_seqs_sets_the_batch_and_what_fits(database):
    """A GPU worker publishes what its engine runs at once and why (its cache layout, read from
    vLLM); doctor names a bf16 27B on an 80 GB card as cache-bound and says to serve FP8."""
    from vidlora.admission import CacheGroup, EngineMemory
    from vidlora.models import Worker
    from workers import registry

    groups = (CacheGroup("state", 16384, 16),) * 3 + (CacheGroup("attention", 400, 16),)

    def published(blocks: int, weights: str) -> dict:
        memory = EngineMemory(num_blocks=blocks, block_bytes=16 * 1_638_400, groups=groups, max_num_seqs=256)
        return {"mode": "stream", "capacity": memory.requests(800),
                "memory": {**memory.as_dict(800), "weights": weights, "max_num_seqs": 256}}

    registry.upsert("fit-bf16", "gpu.fit-bf16", status="ready", stream=published(327, "bfloat16"))
    registry.upsert("fit-fp8", "gpu.fit-fp8", status="ready", stream=published(1000, "fp8"))
    try:
        # The rows beat once: a heartbeat period that outlasts the checks before them.
        checks = {c.name: c for c in run_checks(get_settings().model_copy(update={"heartbeat_s": 600}))}
        bf16, fp8 = checks["batch fit-bf16"], checks["batch fit-fp8"]
        assert not bf16.ok and bf16.detail.startswith("runs 65 analyses at once of the 256"), bf16.detail
        assert "79 MB GDN state" in bf16.detail and "VIDLORA_QUANTIZATION=fp8" in bf16.fix
        assert fp8.ok and fp8.detail.startswith("runs 199 analyses at once"), fp8.detail
    finally:
        with session_scope() as session:
            for w in session.scalars(select(Worker).where(Worker.name.in_(["fit-bf16", "fit-fp8"]))):
                session.delete(w)


def test_an_unwritable_adapter_cache_is_the_servers_fault_not_the_adapters(database, tmp_path):
    """The prepared-adapter cache under a file: doctor names the folder as the server's fault
    with a fix, the adapter is "not judged" (never refused), and both recover once it is fixed."""
    from tests.support.tiny import tiny_model

    assert tiny_model()
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the cache folder should be")
    settings = get_settings().model_copy(update={"adapter_cache_dir": blocker / "prepared"})
    checks = {c.name: c for c in run_checks(settings)}
    cache, adapter = checks["adapter cache"], checks["adapter tomb_structure"]
    assert not cache.ok and "NotADirectoryError" in cache.detail and "VIDLORA_ADAPTER_CACHE_DIR" in cache.fix
    assert not adapter.ok and adapter.detail.startswith("not judged: a server fault, not the adapter's")
    assert "refused" not in adapter.detail and str(tmp_path) not in adapter.detail
    assert "adapter cache" in adapter.fix
    blocker.unlink()
    checks = {c.name: c for c in run_checks(settings)}
    assert checks["adapter cache"].ok and checks["adapter tomb_structure"].ok, checks["adapter tomb_structure"]


def test_the_adapter_cache_defaults_under_the_var_dir(tmp_path):
    from engine_patch.registration import cache_dir, registry_for
    from vidlora.config import Settings

    settings = Settings(var_dir=tmp_path / "var")
    assert cache_dir(settings) == tmp_path / "var" / "prepared-adapters"
    assert registry_for(settings).cache_dir == tmp_path / "var" / "prepared-adapters"
