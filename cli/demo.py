"""The main job on one machine: every part of vidlora, real, with nothing to install first.

Embedded defaults (a SQLite database and a SQLite-backed queue under ``var/``, the demo
model shipped in ``demo_model/weights``) unless VIDLORA_* variables point at PostgreSQL, Redis
and real weights; then the same command runs against those. Starts one CPU worker and one GPU
worker as child processes, generates scenes whose contents are known (``vidlora.scenes``:
artifacts, tomb plans, inscriptions), sends each through its scenario, prints every answer
beside the truth, and serves the review UI on localhost.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import click

from vidlora.config import PROJECT_ROOT, get_settings


def _start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "cli", *args], cwd=PROJECT_ROOT, env=env,
        stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True,
    )


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def _ensure_model(settings) -> None:
    tiny_root = settings.var_dir / "tiny-model"
    if Path(settings.model) == tiny_root / "base":
        from testmodels.tiny import build

        click.echo("building the tiny random Qwen3.5 model and its adapters ...")
        build(tiny_root, None)
    elif not (Path(settings.model) / "config.json").is_file():
        raise click.ClickException(f"no model at {settings.model}: set VIDLORA_MODEL, or run "
                                   "`python -m demo_model.train --out demo_model/weights` for the demo model")


SCENES_PER_KIND = 3


def demo_scenes(out_dir: Path) -> dict[str, list[tuple[Path, object]]]:
    """Generated videos per scenario (fresh seeds: never a training example), with their truth."""
    from vidlora import scenes

    return {scenes.SCENARIO_OF[kind]: scenes.generate(kind, [scenes.FRESH_SEEDS + i for i in range(SCENES_PER_KIND)],
                                                      out_dir)
            for kind in scenes.KINDS}


def _ensure_user(username: str) -> str | None:
    """A reviewer account for the demo; returns its new password, or None if it existed."""
    from sqlalchemy import select
    from werkzeug.security import generate_password_hash

    from vidlora.db import session_scope
    from vidlora.models import User

    with session_scope() as session:
        if session.scalar(select(User).where(User.username == username)):
            return None
        password = secrets.token_urlsafe(12)
        session.add(User(username=username, password_hash=generate_password_hash(password)))
        return password


def summary_rows(batch_ids: list[int], truth: dict[str, object]) -> list[tuple[str, ...]]:
    """One row per analysis: its answer (the fields that are scored) beside the scene's truth."""
    from sqlalchemy import select

    from vidlora import scenes
    from vidlora.db import session_scope
    from vidlora.models import Analysis, BatchItem, Result, Scenario

    with session_scope() as session:
        rows = session.execute(
            select(BatchItem.name, Scenario.name, Analysis.status, Analysis.reason, Result)
            .join(Analysis, Analysis.video_id == BatchItem.video_id)
            .join(Scenario, Scenario.id == Analysis.scenario_id)
            .outerjoin(Result, Result.analysis_id == Analysis.id)
            .where(BatchItem.batch_id.in_(batch_ids))
            .order_by(BatchItem.name, Scenario.name)
        ).all()
        out = []
        for video, scenario, status, reason, result in rows:
            scene = truth.get(video)
            latency = f"{result.latency_s:.2f}s" if result else "-"
            if result is None:
                answer, ok = (reason or "")[:40], "-"
            elif scene is None:
                answer, ok = result.text.replace("\n", " ")[:40], "-"
            else:
                answer = scenes.answer_text(scene.kind, result.parsed)
                ok = "yes" if scenes.correct(scene, result.parsed) else "NO"
            out.append((video, scenario, status, latency, answer, scenes.truth_text(scene) if scene else "-", ok))
        return out


def print_summary(batch_ids: list[int], truth: dict[str, object]) -> None:
    rows = summary_rows(batch_ids, truth)
    header = ("video", "scenario", "status", "latency", "answer", "truth", "correct")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        click.echo("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
    scored = [r for r in rows if r[-1] in ("yes", "NO")]
    if scored:
        right = sum(r[-1] == "yes" for r in scored)
        click.echo(f"\n{right} of {len(scored)} answers match what the videos show")


def run_demo(serve: bool, serve_for: float, timeout: float, port: int) -> int:
    from vidlora import db, scenarios

    settings = get_settings()
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    click.echo(f"database: {settings.database_url.split('@')[-1]}   queue: {settings.broker_url.split('@')[-1]}")
    db.upgrade()
    _ensure_model(settings)
    known = set(scenarios.sync())
    videos = {name: made for name, made in demo_scenes(settings.var_dir / "scenes").items() if name in known}
    logs = settings.var_dir / "logs"
    # SIGTERM (a supervisor, a test harness) must stop the workers too: turn it into an
    # exception so the finally below runs instead of leaving orphaned workers behind.
    signal.signal(signal.SIGTERM, _terminate)
    procs = [
        _start(["worker", "cpu", "--concurrency", "1", "--beat"], logs / "cpu-worker.log", env),
        _start(["worker", "gpu"], logs / "gpu-worker.log", env),
    ]
    try:
        return _run_batches(videos, logs, timeout, serve, serve_for, port)
    except KeyboardInterrupt:
        return 130
    finally:
        _stop(procs)


def _run_batches(videos, logs, timeout, serve, serve_for, port) -> int:
    from cli.show import wait_and_show
    from tasks.submit import submit_paths

    batch_ids, truth = [], {}
    for scenario, made in videos.items():
        batch_id, _ = submit_paths([path for path, _ in made], [scenario], f"demo: {scenario}", source="cli")
        batch_ids.append(batch_id)
        truth.update({path.name: scene for path, scene in made})
        click.echo(f"batch {batch_id}: {len(made)} generated videos for {scenario}")
    click.echo(f"(worker logs in {logs})")
    deadline = time.monotonic() + timeout
    code = 0
    for batch_id in batch_ids:
        code = max(code, wait_and_show(batch_id, max(1.0, deadline - time.monotonic())))
    click.echo("")
    print_summary(batch_ids, truth)
    if code != 0:
        click.echo(f"the batch did not finish within {timeout:.0f}s; see the worker logs", err=True)
        return code
    if serve:
        password = _ensure_user("demo")
        click.echo(f"\nreview UI: http://127.0.0.1:{port}/  user: demo"
                   + (f"  password: {password}" if password else " (password set earlier)"))
        _serve(port, serve_for)
    return 0


def _terminate(signum, frame) -> None:
    raise KeyboardInterrupt


def _serve(port: int, serve_for: float) -> None:
    from werkzeug.serving import make_server

    from web import create_app

    server = make_server("127.0.0.1", port, create_app(dev=True), threaded=True)  # dev: a random secret key unless one is set
    if serve_for > 0:
        deadline = time.monotonic() + serve_for
        server.timeout = 0.5
        while time.monotonic() < deadline:
            server.handle_request()
    else:
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
