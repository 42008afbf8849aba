"""`vidlora results`: the Results page's query and exports, for scripts."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import click

from vidlora.results.export import FORMATS, csv_lines, items_lines, jsonl_lines, write_parquet

LINES = {"csv": csv_lines, "items": items_lines, "jsonl": jsonl_lines}


@click.command("results")
@click.option("--scenario", "-s", default="", help="Scenario name (needed for --where and field columns).")
@click.option("--where", "-w", multiple=True,
              help="Field condition, repeatable, all must hold: material=bronze, confidence>=0.7, "
                   "decoration~dragon. On an array: any item (the same item for one array's conditions).")
@click.option("--review-state", default="", help="unreviewed, approved, rejected or edited.")
@click.option("--status", default="", help="Analysis status (done, failed, ...).")
@click.option("--batch", default="", help="Only videos of this batch.")
@click.option("--search", "-q", default="", help="Full-text search in the result text.")
@click.option("--date-from", default="", help="Analyses created on or after this day (YYYY-MM-DD, UTC).")
@click.option("--date-to", default="", help="Analyses created on or before this day.")
@click.option("--confidence", default="", help="Only answers in this model-confidence band: low (<50 %), medium "
                                                 "(50-90 %), high (90-99 %), certain (99 % and above) or unknown.")
@click.option("--sort", default="", help="newest, oldest, name, scenario, or uncertain: the model's least certain "
                                          "answers first (the review queue: --review-state unreviewed --sort uncertain).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="csv", show_default=True,
              help="csv: a row per result; items: a row per item of the answer's arrays; jsonl; parquet.")
@click.option("--out", "-o", type=click.Path(dir_okay=False, path_type=Path), help="File to write (default: stdout).")
def results_command(scenario: str, where: tuple[str, ...], review_state: str, status: str, batch: str, search: str,
                    date_from: str, date_to: str, confidence: str, sort: str, fmt: str, out: Path | None) -> None:
    """Query results by scenario fields and export them."""
    from vidlora.db import session_scope
    from vidlora.results.query import FilterError, count, parse_filters, result_query

    try:
        filters = parse_filters({"scenario": scenario, "where": list(where), "review_state": review_state,
                                 "status": status, "batch": batch, "q": search, "date_from": date_from,
                                 "date_to": date_to, "confidence": confidence, "sort": sort})
        with session_scope() as session:
            total = count(session, result_query(session, filters))
    except FilterError as exc:
        raise click.UsageError(str(exc)) from None
    if fmt == "parquet":
        if out is None and sys.stdout.isatty():
            raise click.UsageError("Parquet is binary: give --out FILE, or redirect stdout.")
        if out is not None:
            write_parquet(filters, str(out))
        else:
            with tempfile.TemporaryFile() as spool:
                write_parquet(filters, spool)
                spool.seek(0)
                shutil.copyfileobj(spool, sys.stdout.buffer)
    else:
        stream = out.open("w", encoding="utf-8", newline="") if out is not None else sys.stdout
        try:
            for chunk in LINES[fmt](filters):
                stream.write(chunk)
        finally:
            if out is not None:
                stream.close()
    click.echo(f"{total} result{'s' if total != 1 else ''} ({fmt}){f' written to {out}' if out else ''}", err=True)
