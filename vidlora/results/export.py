"""Exports of a result query: CSV (one row per result, and one per item of an answer's
arrays), JSON Lines with the typed answer, and Parquet with the answer as typed columns.

CSV columns: the row's columns (``rows.COLUMNS``), then, for a structured scenario, one
``field.<path>`` column per top-level scalar of its schema, and one per top-level array
holding the array as JSON; ``items`` gives each array item its own row with a column per
field. Every generator opens its own session and reads plain rows in chunks from a
server-side cursor (``vidlora.results.stream``), so an export of every result neither holds
the caller's session nor loads everything into memory;
that session is one snapshot (``snapshot_scope``): every row, its reviews and the header are
read at one moment, however long the download streams while reviewers work.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO

from sqlalchemy import Select
from sqlalchemy.orm import Session, defer, joinedload, selectinload

from vidlora.db import snapshot_scope
from vidlora.models import Analysis, Batch, FrameSet, Result, Review
from vidlora.results.fields import FieldSpec
from vidlora.results import stream
from vidlora.results.query import ResultFilters, scenario_fields, scenario_schema
from vidlora.results.rows import COLUMNS, row_dict, stored_confidences

CHUNK = 500
FORMATS = ("csv", "items", "jsonl", "parquet")
FIELD_PREFIX = "field."
# Spreadsheet programs run a cell starting with = + - @ as a formula ("CSV injection"), and
# model output is untrusted. Quoting every cell is not enough: a program told to split on ';'
# (or one that misreads quotes) makes "x;=1+1" two cells, the second a live formula. So
# wherever a cell could start under any split (the value's start, after , ; tab or a line
# break, past spaces and quotes) a formula character gets an apostrophe before it, which
# spreadsheets show as text. A plain signed number stays as it is. CSV only: JSONL and
# Parquet keep values exact. Checked with LibreOffice: tests/vidlora/results/test_spreadsheet.py.
_FORMULA_AT_CELL_START = re.compile(
    r"""(^|[,;\t\r\n])([\s"]*)(?![+-]\d+(?:\.\d+)?(?:[,;\t\r\n"\]}]|$))(?=[=+\-@])""")
_CONTROL_START = ("\t", "\r")  # a cell starting with these is read as a formula by some programs
_MAY_START_A_FORMULA = re.compile(r"[=+\-@\t\r]")  # a cell without these needs no look (most cells)
# The same for a cell of JSON, where a tab or carriage return inside a string is written as \t, \r.
_JSON_MAY_HOLD_A_FORMULA = re.compile(r"[=+\-@]|\\[tr]")


def neutralise(value: str) -> str:
    """``value`` with an apostrophe before every formula character a spreadsheet could see at
    the start of a cell, whichever separator it splits on."""
    value = _FORMULA_AT_CELL_START.sub(lambda m: m.group(1) + m.group(2) + "'", value)
    return "'" + value if value.startswith(_CONTROL_START) else value


def _neutral_leaves(value: Any) -> Any:
    """A JSON cell's strings (and keys) each neutralised as a cell of their own: the cell stays
    valid JSON, and its members are separated by ", " so none starts a split cell bare."""
    if isinstance(value, dict):
        return {neutralise(str(k)): _neutral_leaves(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_neutral_leaves(v) for v in value]
    return neutralise(value) if isinstance(value, str) else value


def with_provenance(stmt: Select) -> Select:
    """Load what a row names besides the answer (frames, reviews) with the rows, not per row,
    and only what a row shows: a frame set's and a batch's few columns joined in, the engine's
    token ids (hundreds per answer) never read. At 100k rows loading is most of an export.
    The confidences are read apart, as plain rows (``provenance_rows``)."""
    return stmt.options(joinedload(Analysis.frame_set).load_only(FrameSet.deinterlace, FrameSet.timestamps),
                        joinedload(Analysis.batch).load_only(Batch.name),
                        defer(Result.token_ids),
                        selectinload(Result.reviews).selectinload(Review.user))


def provenance_rows(session: Session, rows: Sequence) -> Iterator[dict]:
    """``row_dict`` of each (analysis, result, video, scenario) of one chunk, the chunk's
    confidences read in one query."""
    confidences = stored_confidences(session, [r[1].id for r in rows if r[1] is not None])
    for analysis, result, video, scenario in rows:
        yield row_dict(analysis, result, video, scenario,
                       confidences.get(result.id, {}) if result is not None else None)


def _rows(session: Session, filters: ResultFilters) -> Iterator[dict]:
    return stream.rows(session, filters, CHUNK)


def _cell(value) -> str:
    kind = type(value)  # the common kinds first, by type: 46 cells a row, 100k rows an export
    if kind is str:
        return neutralise(value) if _MAY_START_A_FORMULA.search(value) else value
    if value is None:
        return ""
    if kind is int or kind is float:
        return str(value)
    if isinstance(value, (dict, list)):
        plain = json.dumps(value, sort_keys=True, ensure_ascii=False)
        if not _JSON_MAY_HOLD_A_FORMULA.search(plain):  # no string in it has anything to neutralise
            return plain
        return json.dumps(_neutral_leaves(value), sort_keys=True, ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    if not isinstance(value, str):
        return str(value)
    return neutralise(value) if _MAY_START_A_FORMULA.search(value) else value


def _get(value: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _writer() -> tuple[csv.writer, io.StringIO]:
    buffer = io.StringIO()
    # Every cell quoted: a spreadsheet in a locale whose separator is ';' then still reads
    # one cell per value, and never a bare '=...'.
    return csv.writer(buffer, quoting=csv.QUOTE_ALL), buffer


def _flush(buffer: io.StringIO) -> str:
    data = buffer.getvalue()
    buffer.seek(0)
    buffer.truncate()
    return data


def field_columns(fields: list[FieldSpec]) -> list[str]:
    """The answer's top-level scalars, then its top-level arrays (as JSON), by path."""
    scalars = [f.path for f in fields if f.array is None]
    arrays = list(dict.fromkeys(f.array for f in fields if f.array is not None))
    return scalars + arrays


def csv_lines(filters: ResultFilters) -> Iterator[str]:
    with snapshot_scope() as session:
        extra = field_columns(scenario_fields(session, filters.scenario))
        writer, buffer = _writer()
        writer.writerow([*COLUMNS, *(FIELD_PREFIX + c for c in extra)])
        yield "\ufeff" + _flush(buffer)  # a BOM: spreadsheet programs then read UTF-8 names correctly
        # A chunk of rows a piece: a write to the client per row was a system call per row.
        for part in stream.chunks(session, filters, CHUNK, ordered=False):
            for row in part:
                writer.writerow([_cell(row[c]) for c in COLUMNS] + [_cell(_get(row["fields"], c)) for c in extra])
            yield _flush(buffer)


ITEM_COLUMNS = ("analysis_id", "result_id", "video_id", "video_name", "scenario", "review_state", "array", "item")


def items_lines(filters: ResultFilters) -> Iterator[str]:
    """One row per item of each top-level array of the answer (one row per find, per chamber)."""
    with snapshot_scope() as session:
        yield from _item_lines(session, filters)


def _item_lines(session: Session, filters: ResultFilters) -> Iterator[str]:
    fields = scenario_fields(session, filters.scenario)
    arrays = list(dict.fromkeys(f.array for f in fields if f.array is not None))
    columns = [f.path for f in fields if f.array is not None]
    writer, buffer = _writer()
    writer.writerow([*ITEM_COLUMNS, *(FIELD_PREFIX + c for c in columns)])
    yield "\ufeff" + _flush(buffer)
    for row in _rows(session, filters):
        answer = row["fields"]
        for array in arrays:
            items = _get(answer, array)
            for index, item in enumerate(items if isinstance(items, list) else []):
                cells = []
                for path in columns:
                    if path == array:  # a list of scalars: the item is the value
                        cells.append(_cell(item))
                    elif path.startswith(array + "."):
                        cells.append(_cell(_get(item, path[len(array) + 1:])))
                    else:
                        cells.append("")
                writer.writerow([_cell(row[c]) for c in ITEM_COLUMNS[:6]] + [array, str(index)] + cells)
                yield _flush(buffer)


def jsonl_lines(filters: ResultFilters) -> Iterator[str]:
    with snapshot_scope() as session:
        for row in _rows(session, filters):
            yield json.dumps(row, ensure_ascii=False) + "\n"


def write_parquet(filters: ResultFilters, out: BinaryIO | str) -> int:
    """The rows as Parquet; a structured scenario's answer as typed nested columns. Returns
    the number of rows written."""
    from vidlora.results.parquet import ParquetRows

    with snapshot_scope() as session:
        writer = ParquetRows(out, scenario_schema(session, filters.scenario))
        chunk: list[dict] = []
        for row in _rows(session, filters):
            chunk.append(row)
            if len(chunk) >= CHUNK:
                writer.write(chunk)
                chunk = []
        writer.write(chunk)
    return writer.close()
