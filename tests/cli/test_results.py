"""`vidlora results`: the command scripts use to query by field and export, run as a user runs it."""

import csv
import io
import json
import subprocess

import pyarrow.parquet as pq

from tests.support.cli import vidlora as run_cli
from tests.support.structured import seed_structured

ANSWERS = [{"sealed": True, "finds": [{"material": "bronze", "period": "han", "confidence": 0.8}]},
           {"sealed": False, "finds": [{"material": "bronze", "period": "tang", "confidence": 0.4},
                                       {"material": "jade", "period": "han", "confidence": 0.9}]},
           {"sealed": False, "finds": []}]


def vidlora(*args: str) -> subprocess.CompletedProcess:
    return run_cli("results", *args, text=False)


def test_results_where_as_csv_jsonl_and_parquet(database, tmp_path):
    seeded = seed_structured(ANSWERS)
    out = vidlora("--scenario", seeded.scenario, "--where", "material=bronze", "--where", "confidence>=0.5")
    assert out.returncode == 0, out.stderr
    rows = list(csv.DictReader(io.StringIO(out.stdout.decode().lstrip("\ufeff"))))
    assert [r["result_id"] for r in rows] == [str(seeded.result_ids[0])] and rows[0]["field.sealed"] == "true"
    assert b"1 result (csv)" in out.stderr

    # The review queue least certain first (issue 51), in a confidence band.
    unsure = seed_structured(ANSWERS, confidences=[{"sealed": 0.7}, {"sealed": 0.4, "finds": 0.6}, None])
    out = vidlora("-s", unsure.scenario, "--review-state", "unreviewed", "--sort", "uncertain", "--format", "jsonl")
    queue = [json.loads(line) for line in out.stdout.decode().splitlines()]
    first, second, unknown = unsure.result_ids
    assert [(r["result_id"], r["model_confidence"]) for r in queue] == [(second, 0.4), (first, 0.7), (unknown, None)]
    out = vidlora("-s", unsure.scenario, "--confidence", "low", "--format", "jsonl")
    assert [json.loads(line)["result_id"] for line in out.stdout.decode().splitlines()] == [second]
    out = vidlora("-s", unsure.scenario, "--confidence", "sure")
    assert out.returncode == 2 and b"Confidence must be one of" in out.stderr

    out = vidlora("-s", seeded.scenario, "-w", "period=han", "--format", "jsonl")
    assert sorted(json.loads(line)["result_id"] for line in out.stdout.decode().splitlines()) == seeded.result_ids[:2]

    target = tmp_path / "catalogue.parquet"
    out = vidlora("-s", seeded.scenario, "--format", "parquet", "--out", str(target))
    assert out.returncode == 0 and b"3 results (parquet) written to" in out.stderr
    assert sorted(len(r["fields"]["finds"]) for r in pq.read_table(target).to_pylist()) == [0, 1, 2]

    out = vidlora("-s", seeded.scenario, "--format", "items", "-w", "material=jade")
    items = list(csv.DictReader(io.StringIO(out.stdout.decode().lstrip("\ufeff"))))
    assert [(r["item"], r["field.finds.material"]) for r in items] == [("0", "bronze"), ("1", "jade")]


def test_a_bad_condition_is_a_usage_error(database):
    seeded = seed_structured(ANSWERS[:1])
    out = vidlora("-s", seeded.scenario, "-w", "colour=red")
    assert out.returncode == 2 and b"has no field 'colour'" in out.stderr and out.stdout == b""
