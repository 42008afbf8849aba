"""Streamed CSV and JSONL exports of a result query.

The generator opens its own session and reads in chunks (``yield_per``), so an export of
every result neither holds the request's session nor loads everything into memory.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator

from vidlora.db import is_postgres, session_scope
from web.query.filters import ResultFilters, build_query
from web.query.rows import COLUMNS, row_dict

CHUNK = 500
# Spreadsheet programs run a cell starting with these as a formula ("CSV injection");
# model output is untrusted, so such cells get a leading apostrophe in CSV (not in JSONL).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _rows(filters: ResultFilters) -> Iterator[dict]:
    with session_scope() as session:
        stmt = build_query(filters, is_postgres()).execution_options(yield_per=CHUNK)
        for analysis, result, video, scenario in session.execute(stmt):
            yield row_dict(analysis, result, video, scenario)


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        value = json.dumps(value, sort_keys=True)
    if not isinstance(value, str):
        return str(value)
    return "'" + value if value.startswith(FORMULA_STARTS) else value


def csv_lines(filters: ResultFilters) -> Iterator[str]:
    buffer = io.StringIO()
    writer = csv.writer(buffer)

    def flush() -> str:
        data = buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
        return data

    writer.writerow(COLUMNS)
    yield "\ufeff" + flush()  # a BOM: spreadsheet programs then read UTF-8 names correctly
    for row in _rows(filters):
        writer.writerow([_cell(row[c]) for c in COLUMNS])
        yield flush()


def jsonl_lines(filters: ResultFilters) -> Iterator[str]:
    for row in _rows(filters):
        yield json.dumps(row, ensure_ascii=False) + "\n"
