"""`vidlora scenarios register | promote | rollback | versions`: a scenario's adapter versions."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import click

from vidlora.config import get_settings


@contextmanager
def scenario_session(name: str):
    """A session and the scenario row; a ClickException for what the user got wrong."""
    from vidlora.db import session_scope
    from vidlora.feedback.measure import EvalError, scenario_or_error
    from vidlora.feedback.releases import ReleaseError

    try:
        with session_scope() as session:
            yield session, scenario_or_error(session, name)
    except (EvalError, ReleaseError) as exc:
        raise click.ClickException(str(exc)) from None


@click.command("register")
@click.argument("scenario")
@click.argument("path", type=click.Path(file_okay=False, path_type=Path))
@click.option("--note", default=None, help="What this version is (kept with it).")
@click.option("--gold-run/--no-gold-run", "run_gold", default=True, show_default=True,
              help="Answer the scenario's gold set with it now (starts an engine in this process).")
def register_command(scenario: str, path: Path, note: str | None, run_gold: bool) -> None:
    """Register the adapter at PATH as a candidate version of SCENARIO; it serves nothing until
    promoted. PATH is a folder as your shell names it (what a trainer's --out just wrote); a
    relative PATH that is not there is looked up under the adapter root."""
    from vidlora.feedback.releases import register_candidate

    settings = get_settings()
    source = adapter_folder(path, Path(settings.adapter_root))
    with scenario_session(scenario) as (session, row):
        release = register_candidate(session, row, source, note)
        release_id, version = release.id, release.version
    click.echo(f"{scenario}: adapter version {version} registered as a candidate from {source}")
    if not source.is_relative_to(Path(settings.adapter_root).resolve()):
        click.echo(f"note: {source} is outside the adapter root ({settings.adapter_root}): GPU workers on other "
                   "hosts must see it at this same path before it can be promoted", err=True)
    if run_gold:
        gold_run(release_id, scenario, version)


def adapter_folder(path: Path, adapter_root: Path) -> Path:
    """The folder ``path`` names: as typed (absolute, or relative to the current directory),
    else under the adapter root, where scenarios.yaml's adapter paths are."""
    if path.is_absolute() or path.is_dir():
        return path.resolve()
    return (adapter_root / path).resolve()


def gold_run(release_id: int, scenario: str, version: str, err: bool = False) -> None:
    """``err``: say it on stderr (stdout carries JSON)."""
    # vLLM logs to stdout by default; a command's stdout is its answer (JSON for scripts).
    # Set before vLLM is first imported, which reads it once.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    from tasks.gold_run import run_candidate

    answered = run_candidate(release_id, get_settings())
    click.echo(f"{scenario}: candidate {version} answered {answered} gold video(s); "
               f"compare with: vidlora eval {scenario} --compare {version[:12]}", err=err)


@click.command("promote")
@click.argument("scenario")
@click.argument("version")
def promote_command(scenario: str, version: str) -> None:
    """Serve adapter VERSION (or a unique prefix) for SCENARIO's new analyses."""
    from vidlora.feedback.releases import promote

    with scenario_session(scenario) as (session, row):
        release = promote(session, row, version)
        click.echo(f"{scenario}: now serving adapter version {release.version} (results keep the version that made them)")


@click.command("rollback")
@click.argument("scenario")
def rollback_command(scenario: str) -> None:
    """Serve again the adapter version the serving one replaced."""
    from vidlora.feedback.releases import rollback

    with scenario_session(scenario) as (session, row):
        release = rollback(session, row)
        click.echo(f"{scenario}: rolled back to adapter version {release.version}")


@click.command("versions")
@click.argument("scenario")
def versions_command(scenario: str) -> None:
    """SCENARIO's registered adapter versions, newest first."""
    from vidlora.feedback.releases import releases
    from vidlora.results.rows import iso_utc, shown_name

    with scenario_session(scenario) as (session, row):
        for r in releases(session, row):
            gold = f"gold run {iso_utc(r.gold_run_at)}" if r.gold_run_at else "no gold run"
            click.echo(f"{r.version}  {r.status:<9}  {shown_name(r.path)}  {gold}  {r.note or ''}".rstrip())
        click.echo(f"serving: {row.adapter_version or 'no adapter'}")
