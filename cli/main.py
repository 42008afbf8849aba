"""The `vidlora` command line: enqueue, status, results, workers, database, scenarios, web, demo, doctor."""

from __future__ import annotations

import json
import os
import logging
import sys
from pathlib import Path

import click

from cli.show import print_batch, wait_and_show
from vidlora.config import get_settings


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log at INFO level.")
def main(verbose: bool) -> None:
    """vidlora: batch video analysis with many LoRA scenarios on one shared model."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


# -- database ----------------------------------------------------------------------------


@main.group()
def db() -> None:
    """Database schema."""


@db.command("upgrade")
def db_upgrade() -> None:
    """Apply every migration (alembic upgrade head) and sync scenarios."""
    from vidlora import db as database
    from vidlora import scenarios

    database.upgrade()
    scenarios.sync()
    click.echo("database at head; scenarios synced")


# -- scenarios ---------------------------------------------------------------------------


@main.group("scenarios", invoke_without_command=True)
@click.pass_context
def scenarios_cmd(ctx: click.Context) -> None:
    """Sync scenarios from the scenario file and list them; or manage a scenario's adapter
    versions (register, promote, rollback, versions)."""
    from vidlora.scenarios import ScenarioError, sync

    if ctx.invoked_subcommand is not None:
        return
    try:
        names = sync()
    except ScenarioError as exc:
        raise click.ClickException(str(exc)) from exc
    for name in names:
        click.echo(name)


# -- enqueue / status --------------------------------------------------------------------


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--scenario", "-s", "scenarios", multiple=True, required=True, help="Scenario name (repeatable).")
@click.option("--name", default=None, help="Batch name (default: the first path).")
@click.option("--wait", is_flag=True, help="Wait until the batch is finished, then print its status.")
@click.option("--timeout", default=0.0, help="With --wait: give up after this many seconds (0: never).")
def enqueue(paths: tuple[Path, ...], scenarios: tuple[str, ...], name: str | None, wait: bool, timeout: float) -> None:
    """Register videos, folders and archives (.zip, .tar, .tar.gz) for analysis."""
    from tasks.submit import submit_paths
    from vidlora.batches import BatchError
    from vidlora.scenarios import sync

    sync()
    try:
        batch_id, parked = submit_paths(list(paths), list(scenarios), name or paths[0].name, source="cli")
    except BatchError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"batch {batch_id}: {parked} file(s) queued for ingest")
    if wait:
        sys.exit(wait_and_show(batch_id, timeout))


@main.command()
@click.argument("batch_id", type=int, required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--latency", is_flag=True, help="Per scenario: P50/P95 upload-to-result and engine time, target met?")
@click.option("--window", default="24h", show_default=True, help="With --latency: the window (90m, 24h, 7d).")
@click.option("--workers", is_flag=True, help="Each GPU worker: health, engine load (in flight per adapter, waiting, tokens/s).")
def status(batch_id: int | None, as_json: bool, latency: bool, window: str, workers: bool) -> None:
    """Per-video and per-analysis progress of a batch (default: the latest), with --latency
    each scenario's latency over a window, or with --workers each GPU worker's engine."""
    from sqlalchemy import func, select

    from vidlora.db import session_scope
    from vidlora.models import Batch
    from vidlora.status import batch_view

    if latency:
        _print_latency(window, as_json)
        return
    if workers:
        _print_workers(as_json)
        return
    with session_scope() as session:
        if batch_id is None:
            batch_id = session.scalar(select(func.max(Batch.id)))
            if batch_id is None:
                raise click.ClickException("no batches yet")
        view = batch_view(session, batch_id)
    if view is None:
        raise click.ClickException(f"no batch {batch_id}")
    if as_json:
        click.echo(json.dumps(view.as_dict(), indent=2, default=str))
    else:
        print_batch(view)


def _print_workers(as_json: bool) -> None:
    from vidlora.db import session_scope
    from vidlora.status import stream_words
    from web.scenarios.health import worker_health

    with session_scope() as session:
        rows = [wh.as_dict() for wh in worker_health(session)]
    if as_json:
        click.echo(json.dumps({"workers": rows}, indent=2, default=str))
        return
    if not rows:
        click.echo("no GPU worker has reported yet (start one with: vidlora worker gpu)")
    for w in rows:
        click.echo(f"{w['name']:<28} {w['health']:<9} {stream_words(w['stream'])}")
        canary = w.get("last_canary") or {}
        if canary.get("ok") is False:  # a failed canary, or the start-up checks that stopped it
            click.echo(f"{'':<28} {canary.get('reason') or canary.get('detail')}")


def _print_latency(window: str, as_json: bool) -> None:
    from vidlora.db import session_scope
    from vidlora.latency import parse_window, scenario_latency

    try:
        span = parse_window(window)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--window") from None
    with session_scope() as session:
        rows = scenario_latency(session, span)
    if as_json:
        click.echo(json.dumps({"window_s": span.total_seconds(), "scenarios": [r.as_dict() for r in rows]}, indent=2))
        return
    seconds = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    click.echo(f"last {window}   results   P50 total   P95 total   P50 engine   P95 engine   target P95")
    for r in rows:
        target = "-" if r.target_p95_s is None else f"{r.target_p95_s:.0f} s " + (
            "met" if r.target_met else "MISSED" if r.target_met is False else "(no data)")
        click.echo(f"{r.scenario:<28} {r.count:>6} {seconds(r.p50_total_s):>11} {seconds(r.p95_total_s):>11} "
                   f"{seconds(r.p50_engine_s):>12} {seconds(r.p95_engine_s):>12}   {target}")


# -- workers -----------------------------------------------------------------------------


@main.group()
def worker() -> None:
    """Run a Celery worker."""


@worker.command("cpu")
@click.option("--concurrency", "-c", default=2, help="Prefork children.")
@click.option("--beat/--no-beat", default=False, help="Also run the periodic reconciler (one worker only).")
@click.option("--loglevel", default="INFO")
def worker_cpu(concurrency: int, beat: bool, loglevel: str) -> None:
    """Ingest and frame sampling (prefork, hard time limits)."""
    settings = get_settings()
    if settings.metrics_port:
        _multiprocess_metrics_dir(settings.var_dir / f"metrics-cpu-{os.getpid()}")
    from tasks.celery_app import CONTROL_QUEUE, CPU_QUEUE, run_worker

    argv = [
        "worker", "--pool=prefork", f"--concurrency={concurrency}", "-Q", f"{CPU_QUEUE},{CONTROL_QUEUE}",
        "--prefetch-multiplier=1", f"--loglevel={loglevel}", "-n", f"cpu-{os.getpid()}@%h",
        "--without-gossip", "--without-mingle",
    ]
    if beat:
        # Beat's schedule file lives in var_dir; if the directory is missing the embedded beat
        # process dies at start while the worker keeps running, and nothing reconciles.
        settings.var_dir.mkdir(parents=True, exist_ok=True)
        argv += ["--beat", "--schedule", str(settings.var_dir / "celerybeat-schedule")]
    if settings.metrics_port:
        from vidlora import metrics

        metrics.serve(settings.metrics_port)  # the sum of every prefork child's metrics
    sys.exit(run_worker(argv))


def _multiprocess_metrics_dir(path: Path) -> None:
    """Prefork children write their metrics here; it must be set before prometheus_client is
    first imported (it picks its value store then), and start empty (a dead worker's files
    would be summed in)."""
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*.db"):
        stale.unlink()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path)


@worker.command("gpu")
@click.option("--loglevel", default="INFO")
def worker_gpu(loglevel: str) -> None:
    """One engine per process serving every adapter (solo pool; run one per GPU)."""
    from tasks.gpu_worker import run

    sys.exit(run(loglevel))


# -- operators -----------------------------------------------------------------------------


@main.command("audit")
@click.argument("batch_ids", nargs=-1, type=int)
def audit_cmd(batch_ids: tuple[int, ...]) -> None:
    """Count lost, duplicated, stuck and unchecked work (all batches by default)."""
    from vidlora.audit import audit
    from vidlora.db import session_scope

    with session_scope() as session:
        report = audit(session, list(batch_ids) or None)
    for key, value in report.counts.items():
        click.echo(f"{key:<22} {value}")
    sys.exit(0 if report.clean else 1)


@main.command()
def doctor() -> None:
    """Check services, migrations, queues, GPU workers and adapters; say how to fix problems."""
    from cli.doctor import run_checks

    problems = 0
    for check in run_checks(get_settings()):
        mark = "ok  " if check.ok else "FAIL"
        click.echo(f"[{mark}] {check.name}: {check.detail}")
        if not check.ok:
            problems += 1
            click.echo(f"       fix: {check.fix}")
    sys.exit(1 if problems else 0)


# -- the main job ------------------------------------------------------------------------


@main.command()
@click.option("--serve/--no-serve", default=True, help="Serve the review UI when the batch is done.")
@click.option("--serve-for", default=0.0, help="Stop serving after this many seconds (0: until Ctrl-C).")
@click.option("--timeout", default=1800.0, help="Give up waiting for the batch after this many seconds.")
@click.option("--port", default=None, type=int, help="Port for the review UI (default: VIDLORA_WEB_PORT).")
def demo(serve: bool, serve_for: float, timeout: float, port: int | None) -> None:
    """Run the sample videos through every scenario end to end, then serve the review UI."""
    from cli.demo import run_demo

    sys.exit(run_demo(serve, serve_for, timeout, port or get_settings().web_port))


def _register_commands() -> None:
    from cli.feedback import eval_command, export_training_command, gold_group
    from cli.releases import promote_command, register_command, rollback_command, versions_command
    from cli.results import results_command
    from cli.upload import upload_command
    from web.cli import token_group, user_group, web_command

    main.add_command(results_command)
    main.add_command(upload_command)
    main.add_command(eval_command)
    main.add_command(export_training_command)
    main.add_command(gold_group)
    for command in (register_command, promote_command, rollback_command, versions_command):
        scenarios_cmd.add_command(command)
    main.add_command(user_group)
    main.add_command(token_group)
    main.add_command(web_command)


_register_commands()


if __name__ == "__main__":
    main()
