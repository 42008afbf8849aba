"""The result exports as HTTP downloads: the Results page's links and the API's export routes
answer with this one function, so a script's export has the page's columns and filters.

CSV, per-item CSV and JSON Lines are streamed as they are read (an export of every result
never sits in memory); Parquet's footer comes last, so it is written whole to a temporary
file (disk, not memory), then sent.
"""

from __future__ import annotations

import tempfile
from datetime import datetime, timezone

from flask import Response, request, send_file, stream_with_context

from vidlora.results.export import csv_lines, items_lines, jsonl_lines, write_parquet
from vidlora.results.query import FilterError, parse_filters, result_query
from web.database import get_db

STREAMED = {
    "csv": (csv_lines, "text/csv; charset=utf-8"),
    "items.csv": (items_lines, "text/csv; charset=utf-8"),
    "jsonl": (jsonl_lines, "application/x-ndjson; charset=utf-8"),
}
PARQUET = "application/vnd.apache.parquet"
KINDS = (*STREAMED, "parquet")


def _filename(suffix: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"vidlora-results-{stamp}.{suffix}"


def _check_items(filters) -> None:
    """One row per item of a list in the answers: only a scenario's schema says which lists
    there are. Without one the export would read every result to write a header only."""
    if not filters.scenario:
        raise FilterError("The per-item export is per scenario: its rows are the items of the scenario's lists "
                          "(finds, chambers). Give scenario=NAME, or use export.csv for one row per result.")


def download(kind: str) -> Response:
    """The export of ``kind`` for the request's filters; FilterError (a 400 in both
    blueprints) before a byte is sent, not a broken download."""
    filters = parse_filters(request.args)
    result_query(get_db(), filters)  # a bad field condition fails here, not mid-stream
    if kind == "items.csv":
        _check_items(filters)
    if kind == "parquet":
        spool = tempfile.TemporaryFile(suffix=".parquet")
        write_parquet(filters, spool)
        spool.seek(0)
        return send_file(spool, mimetype=PARQUET, as_attachment=True, download_name=_filename("parquet"))
    lines, mimetype = STREAMED[kind]
    response = Response(stream_with_context(lines(filters)), mimetype=mimetype)
    response.headers["Content-Disposition"] = f'attachment; filename="{_filename(kind)}"'
    return response
