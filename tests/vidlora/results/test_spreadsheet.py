"""CSV exports opened by a real spreadsheet program (LibreOffice, headless): not one formula
cell whether it splits on ',' or ';' (issue 32), for values built to start a cell after any
separator, quote or line break. The same values written by a plain quoting CSV writer do give
formula cells when split on ';': the check can fail."""

from __future__ import annotations

import csv
import itertools
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.structured import seed_structured
from vidlora.results.export import csv_lines, items_lines
from vidlora.results.query import parse_filters

SOFFICE = shutil.which("soffice") or shutil.which("libreoffice")
# LibreOffice's CSV import options: separator, text delimiter ("), UTF-8, first line 1, no
# column types, default language, quoted fields not forced to text, detect special numbers,
# (3 export-only), all sheets, and "evaluate formulas" on: the most a user could ask for.
IMPORT = "Text - txt - csv (StarCalc):{sep},34,76,1,,0,false,true,false,false,false,-1,true"
SEPARATORS = {",": 44, ";": 59}


def hostile_values() -> list[str]:
    """A formula after every kind of place a split could start a cell."""
    before = ["", "x", 'x"', '"', " "]
    splits = [";", ",", "\n", "\t", '";', '",', ';"', '"\n', "\r\n", "; ", ';""']
    starts = ["=1+1", "+1+1", "-1+1", "@SUM(1;1)", '"=1+1', "=1+1\"", '""=1+1', "=HYPERLINK(\"x\")"]
    return [b + s + f + ";y" for b, s, f in itertools.product(before, splits, starts)]


def formula_cells(paths: list[Path], separator: str, workdir: Path) -> dict[str, int]:
    """Formula cells per file, as LibreOffice reads each CSV with ``separator``."""
    out = workdir / f"sep{SEPARATORS[separator]}"
    # A profile of its own: a user's LibreOffice (or another test's) never locks this one.
    env = {**os.environ, "HOME": str(workdir)}
    done = subprocess.run(
        [SOFFICE, "--headless", "--norestore", f"-env:UserInstallation=file://{workdir}/profile",
         f"--infilter={IMPORT.format(sep=SEPARATORS[separator])}", "--convert-to", "fods", "--outdir", str(out),
         *map(str, paths)], capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    counts = {}
    for path in paths:
        sheet = (out / (path.stem + ".fods")).read_text(encoding="utf-8")
        assert "<table:table-cell" in sheet, f"LibreOffice read nothing from {path.name}"
        counts[path.name] = len(re.findall(r"table:formula=", sheet))
    return counts


@pytest.mark.skipif(SOFFICE is None, reason="LibreOffice is not installed (.ci/run installs libreoffice-calc-nogui)")
def test_no_export_has_a_formula_cell_when_split_on_comma_or_semicolon(database, tmp_path):
    values = hostile_values()
    answers = [{"site": values[i], "sealed": True,
                "finds": [{"material": "bronze", "period": "han", "confidence": 0.5, "decoration": v}
                          for v in values[i + 1:i + 6]]} for i in range(0, len(values), 6)]
    seeded = seed_structured(answers)
    filters = parse_filters({"scenario": seeded.scenario})
    export = tmp_path / "export.csv"
    export.write_text("".join(csv_lines(filters)), encoding="utf-8")
    items = tmp_path / "items.csv"
    items.write_text("".join(items_lines(filters)), encoding="utf-8")
    control = tmp_path / "control.csv"
    with control.open("w", newline="", encoding="utf-8") as out:
        csv.writer(out, quoting=csv.QUOTE_ALL).writerows([[str(i), v, "tail"] for i, v in enumerate(values)])
    for separator in SEPARATORS:
        counts = formula_cells([export, items, control], separator, tmp_path)
        assert counts["export.csv"] == counts["items.csv"] == 0, (separator, counts)
        if separator == ";":
            assert counts["control.csv"] > 0, counts  # the hostile values are hostile
