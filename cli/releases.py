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
    from vidlora.feedback.gate import check
    from vidlora.models import AdapterRelease

    run_candidate(release_id, get_settings())
    with scenario_session(scenario) as (session, row):
        _, verdict = check(session, row, session.get(AdapterRelease, release_id), get_settings().eval_number_tolerance)
    click.echo(f"{scenario}: candidate {version} {verdict.gold_run.words()}; "
               f"compare with: vidlora eval {scenario} --compare {version[:12]}", err=err)
    if not verdict.ok:
        click.echo(f"{scenario}: promote would refuse it: {'; '.join(verdict.blockers)}", err=True)


@click.command("promote")
@click.argument("scenario")
@click.argument("version")
@click.option("--force", is_flag=True, help="Serve it even though its gold run says it should not (needs --reason).")
@click.option("--reason", default=None, help="With --force: why (kept with the version, shown by `versions`).")
def promote_command(scenario: str, version: str, force: bool, reason: str | None) -> None:
    """Serve adapter VERSION (or a unique prefix) for SCENARIO's new analyses, once its gold run
    shows it answers every gold video (no refusal, no error) and is not worse than the serving
    version beyond the gold set's interval."""
    from vidlora.feedback.gate import promote_checked

    if force and not (reason or "").strip():
        raise click.BadParameter('say why with --reason "..." (it is kept with the version)', param_hint="--force")
    if reason and not force:
        raise click.BadParameter("--reason goes with --force", param_hint="--reason")
    with scenario_session(scenario) as (session, row):
        release = promote_checked(session, row, version, get_settings().eval_number_tolerance,
                                  reason if force else None)
        click.echo(f"{scenario}: now serving adapter version {release.version} (results keep the version that made them)")
        if release.forced_reason:
            click.echo(f"{scenario}: forced over the gold-set check ({release.forced_over}); "
                       f"reason kept: {release.forced_reason}", err=True)


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
    from vidlora.feedback.gate import check
    from vidlora.feedback.releases import releases
    from vidlora.results.rows import iso_utc, shown_name

    tolerance = get_settings().eval_number_tolerance
    with scenario_session(scenario) as (session, row):
        for r in releases(session, row):
            gold = f"gold run {iso_utc(r.gold_run_at)}" if r.gold_run_at else "no gold run"
            click.echo(f"{r.version}  {r.status:<9}  {shown_name(r.path)}  {gold}  {r.note or ''}".rstrip())
            _, verdict = check(session, row, r, tolerance)
            if r.gold_run_at:
                click.echo(f"    {verdict.gold_run.words()}")
            if r.status == "candidate":
                click.echo("    promote: " + ("would serve it" if verdict.ok else "refuses: " + "; ".join(verdict.blockers)))
            if r.forced_reason:
                click.echo(f"    promoted by force over: {r.forced_over}\n    reason: {r.forced_reason}")
        click.echo(f"serving: {row.adapter_version or 'no adapter'}")
