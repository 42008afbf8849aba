"""The feedback loop's commands: `vidlora eval`, `vidlora export-training`, `vidlora gold`."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import click

from vidlora.config import get_settings


def _pct(rate: dict) -> str:
    if rate["rate"] is None:
        return "-"
    low, high = rate["ci95"]
    return f"{100 * rate['rate']:5.1f} % ({100 * low:.0f}-{100 * high:.0f})"


def print_agreement(scenario: str, reports: list[dict]) -> None:
    if not reports:
        click.echo(f"{scenario}: no results yet")
    for r in reports:
        click.echo(f"{scenario}  adapter version {r['version'] or 'none'}: {r['results']} results, "
                   f"{r['reviewed']} reviewed, {r['unreviewed']} not yet")
        for state in ("approved", "edited", "rejected"):
            click.echo(f"  {state:<10} {r[state]['count']:>5}  {_pct(r[state])}")
        if r["fields"]:
            click.echo(f"  {'field':<32} {'right':>6} {'of':>6}  accuracy (95 % interval)")
        for f in r["fields"]:
            click.echo(f"  {f['field']:<32} {f['right']:>6} {f['of']:>6}  {_pct(f)}")


def print_calibration(scenario: str, reports: list[dict]) -> None:
    for r in reports:
        a, f = r["answers"], r["fields"]
        sources = ", ".join(f"{n} from {'reviews' if k == 'reviews' else 'the gold set'}"
                            for k, n in sorted(r["sources"].items()))
        click.echo(f"{scenario}  adapter version {r['version'] or 'none'}: calibration of {a['count']} answers "
                   f"({sources}): ECE {100 * a['ece']:.1f} %"
                   + (f"; fields: ECE {100 * f['ece']:.1f} % over {f['count']}" if f["count"] else ""))
        c = r["calibrated"]
        if c["applies"]:
            held = (f"ECE {100 * c['ece_held_out']:.1f} % on answers it was not fitted on ({c['folds']}-fold; "
                    f"chance alone: {100 * c['ece_floor']:.1f} % on this many)"
                    if c["ece_held_out"] is not None else "too few answers to measure it held out")
            click.echo(f"  shown calibrated (a map fitted on these {c['count']} answers): {held}")
        else:
            click.echo(f"  shown as the model gave it: {c['count']} of the {c['minimum']} answers a calibration needs")
        click.echo(f"  {'confidence':<12} {'answers':>7} {'mean conf':>10} {'right':>7}")
        for b in a["bins"]:
            click.echo(f"  {100 * b['low']:3.0f}-{100 * b['high']:3.0f} %    {b['count']:>7} "
                       f"{100 * b['confidence']:9.0f} % {100 * b['accuracy']:6.0f} %")


@click.command("eval")
@click.argument("scenario")
@click.option("--version", default=None, help="Only this adapter version (or a prefix of it).")
@click.option("--compare", "candidate", default=None, metavar="VERSION",
              help="Compare candidate VERSION with the stored answers on the gold set.")
@click.option("--run", is_flag=True, help="With --compare: answer the gold set with the candidate again first.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def eval_command(scenario: str, version: str | None, candidate: str | None, run: bool, as_json: bool) -> None:
    """How often reviewers agree with each adapter version of SCENARIO: approved unchanged,
    edited, rejected, and per field of a structured answer, with counts and 95 % intervals;
    and how well the model's confidence matches (a reliability table and its ECE).
    With --compare, a candidate version against the stored answers on the gold set."""
    from vidlora.db import session_scope
    from vidlora.feedback.calibration import scenario_calibration
    from vidlora.feedback.measure import EvalError, scenario_agreement, scenario_or_error

    if candidate:
        _compare(scenario, candidate, run, as_json)
        return
    try:
        with session_scope() as session:
            row = scenario_or_error(session, scenario)
            reports = [a.as_dict() for a in scenario_agreement(session, row, version,
                                                               get_settings().eval_number_tolerance)]
            calibration = [c.as_dict() for c in scenario_calibration(session, row, version,
                                                                     get_settings().eval_number_tolerance,
                                                                     get_settings().calibration_min_answers)]
    except EvalError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps({"scenario": scenario, "versions": reports, "calibration": calibration}, indent=2))
    else:
        print_agreement(scenario, reports)
        print_calibration(scenario, calibration)


def _compare(scenario: str, candidate: str, run: bool, as_json: bool) -> None:
    from cli.releases import gold_run, scenario_session
    from vidlora.feedback.gate import check
    from vidlora.feedback.releases import find_release

    with scenario_session(scenario) as (session, row):
        release = find_release(session, row, candidate)
        release_id, version, ran = release.id, release.version, release.gold_run_at is not None
    if run or not ran:
        gold_run(release_id, scenario, version, err=as_json)
    with scenario_session(scenario) as (session, row):
        report, verdict = check(session, row, find_release(session, row, version), get_settings().eval_number_tolerance)
    report = {**report, **verdict.as_dict()}
    if as_json:
        click.echo(json.dumps(report, indent=2, ensure_ascii=False))
        return
    right = report["answers_right"]
    click.echo(f"{scenario}: candidate {version} vs stored answers on {report['gold']} gold video(s) "
               f"(stored from versions {', '.join(report['stored_versions']) or '-'})")
    click.echo(f"  {'whole answers right':<32} stored {_pct(right['stored'])}   candidate {_pct(right['candidate'])}")
    for f in report["fields"]:
        click.echo(f"  {f['field']:<32} stored {_pct(f['stored'])}   candidate {_pct(f['candidate'])}")
    click.echo(f"  candidate {verdict.gold_run.words()}")
    click.echo(f"  {len(report['changed'])} answer(s) changed")
    for c in report["changed"]:
        mine = f"no answer ({c['why']})" if c["why"] else json.dumps(c["candidate"], ensure_ascii=False)
        click.echo(f"  result {c['result_id']} {c['video']}\n    stored:    {json.dumps(c['stored'], ensure_ascii=False)}"
                   f"\n    candidate: {mine}"
                   f"\n    reviewed:  {json.dumps(c['reviewed'], ensure_ascii=False)}")
    click.echo(f"  promote: {'would serve it' if verdict.ok else 'refuses: ' + '; '.join(verdict.blockers)}")


def _since(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter("give a date (2026-12-01) or a time (2026-12-01T08:00:00+00:00)",
                                 param_hint="--since") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def _export(scenario: str, out: Path, selection, model: str | None = None) -> None:
    from vidlora.db import session_scope
    from vidlora.feedback.measure import EvalError, scenario_or_error
    from vidlora.feedback.training_set import TrainingSetError, write_training_set

    settings = get_settings()
    try:
        with session_scope() as session:
            row = scenario_or_error(session, scenario)
            written = write_training_set(session, row, out, Path(settings.media_root), selection,
                                         model or settings.model)
    except (EvalError, TrainingSetError) as exc:
        raise click.ClickException(str(exc)) from None
    skipped = ", ".join(f"{n} {why}" for why, n in written.skipped.items())
    click.echo(f"{written.examples} example(s) of {scenario} written to {out}" + (f"; skipped: {skipped}" if skipped else ""))
    factory = written.manifest["llamafactory"]
    if factory["file"] is None:
        click.echo(f"LLaMA-Factory form not written: {factory['why']}", err=True)
    else:
        left = "".join(f"; left out: {n} {why}" for why, n in factory["skipped"].items())
        click.echo(f"LLaMA-Factory {factory['version']}: {factory['examples']} example(s) in {factory['file']}{left}; "
                   f"train with: llamafactory-cli train {out / factory['recipe']}")
        click.echo(f"the recipe continues the serving adapter {factory['continues']}" if factory["continues"]
                   else f"the recipe trains a fresh LoRA: {factory['fresh_lora_why']}")


@click.command("export-training")
@click.argument("scenario")
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="A new (or empty) folder.")
@click.option("--since", default=None, help="Only answers reviewed on or after this date (UTC).")
@click.option("--include", default="edited,approved", show_default=True,
              help="Which reviewed answers: edited, approved, or both.")
@click.option("--with-gold", is_flag=True, help="Include the gold set (held out by default).")
@click.option("--link", is_flag=True, help="Hard-link the frames instead of copying them (same file system).")
@click.option("--model", default=None,
              help="The served model's folder (its tokenizer and video processor config; no weights needed), "
                   "where VIDLORA_MODEL is not on this host. It decides LLaMA-Factory's form of the set.")
def export_training_command(scenario: str, out: Path, since: str | None, include: str, with_gold: bool,
                            link: bool, model: str | None) -> None:
    """Write SCENARIO's reviewed answers as a training set: messages JSON Lines with each
    video's frames and timestamps (LLaMA-Factory sharegpt / ms-swift messages), a manifest."""
    from vidlora.feedback.training_set import Selection, TrainingSetError

    try:
        selection = Selection(include=tuple(p.strip() for p in include.split(",") if p.strip()),
                              since=_since(since), with_gold=with_gold, link=link)
    except TrainingSetError as exc:
        raise click.BadParameter(str(exc), param_hint="--include") from None
    _export(scenario, out, selection, model)


@click.group("gold")
def gold_group() -> None:
    """The gold set: reviewed results held out of training, on which new versions are tested."""


@gold_group.command("add")
@click.argument("result_ids", nargs=-1, type=int, required=True)
def gold_add(result_ids: tuple[int, ...]) -> None:
    """Mark reviewed results as gold."""
    _set_gold(result_ids, True)


@gold_group.command("remove")
@click.argument("result_ids", nargs=-1, type=int, required=True)
def gold_remove(result_ids: tuple[int, ...]) -> None:
    """Return results from the gold set to training."""
    _set_gold(result_ids, False)


def _set_gold(result_ids: tuple[int, ...], gold: bool) -> None:
    from vidlora.db import session_scope
    from vidlora.feedback.gold import GoldError, set_gold
    from vidlora.models import Result

    with session_scope() as session:
        for result_id in result_ids:
            result = session.get(Result, result_id)
            if result is None:
                raise click.ClickException(f"There is no result {result_id}.")
            try:
                set_gold(result, gold, None)
            except GoldError as exc:
                raise click.ClickException(f"result {result_id}: {exc}") from None
    click.echo(f"{len(result_ids)} result(s) {'marked gold' if gold else 'returned to training'}")


@gold_group.command("list")
@click.argument("scenario")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def gold_list(scenario: str, as_json: bool) -> None:
    """SCENARIO's gold results."""
    from vidlora.db import session_scope
    from vidlora.feedback.gold import gold_results
    from vidlora.feedback.measure import EvalError, scenario_or_error
    from vidlora.results.rows import iso_utc

    try:
        with session_scope() as session:
            rows = [{"result_id": r.id, "video": r.analysis.video.original_name, "review_state": r.review_state,
                     "adapter_version": r.adapter_version, "gold_at": iso_utc(r.gold_at)}
                    for r in gold_results(session, scenario_or_error(session, scenario).id)]
    except EvalError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps({"scenario": scenario, "gold": rows}, indent=2))
        return
    for r in rows:
        click.echo(f"{r['result_id']:>8}  {r['review_state']:<9} {r['adapter_version'] or '-':<18} {r['video']}")
    click.echo(f"{len(rows)} gold result(s)")


@gold_group.command("export")
@click.argument("scenario")
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False, path_type=Path))
def gold_export(scenario: str, out: Path) -> None:
    """Write SCENARIO's gold set in the training-set format (frames, prompts, reviewed answers)."""
    from vidlora.feedback.training_set import Selection

    _export(scenario, out, Selection(gold_only=True))
