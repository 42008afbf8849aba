"""The feedback loop end to end on the CPU (issue 33): the demo model analyses tomb videos
through the real pipeline; a reviewer approves some answers and corrects others and marks two
as gold; `vidlora export-training` writes the training set; `demo_model.finetune` trains the
adapter's next version for a few steps from that export (read as a trainer reads it);
`vidlora scenarios register` makes it a candidate and answers the gold set with it, without
touching stored results; `vidlora eval --compare` shows it beside the stored answers;
another scenario's adapter, registered as a candidate too, shows worse on the same videos;
`promote` makes new analyses use v2 while old results keep v1's provenance; `rollback` returns.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.support.env import ROOT
from tests.support.reports import report
from tests.support.workers import wait_for
from vidlora import scenes

pytestmark = pytest.mark.engine

SCENARIO = "tomb_loop"
VIDEOS = 6


@pytest.fixture(scope="module")
def loop(start_worker, cpu_worker, tmp_path_factory):
    """A GPU worker serving the demo model, with the shipped tomb scenario under its own name;
    the test database's scenarios are put back afterwards."""
    from demo_model import ADAPTERS, BASE
    from vidlora.config import PROJECT_ROOT, get_settings
    from vidlora.db import session_scope
    from vidlora.scenarios import load_scenarios, sync_from_settings, sync_scenarios

    work = tmp_path_factory.mktemp("loop")
    shipped = next(e for e in yaml.safe_load((PROJECT_ROOT / "scenarios.yaml").read_text())["scenarios"]
                   if e["name"] == "tomb_structure")
    entry = dict(shipped, name=SCENARIO, adapter=str(ADAPTERS / "tomb_structure"))
    entry.pop("slo", None)
    scenarios_file = work / "scenarios.yaml"
    scenarios_file.write_text(yaml.safe_dump({"scenarios": [entry]}, sort_keys=False))
    env = {"VIDLORA_MODEL": str(BASE), "VIDLORA_ADAPTER_ROOT": str(ADAPTERS),
           "VIDLORA_SCENARIOS_FILE": str(scenarios_file)}
    with session_scope() as session:
        sync_scenarios(session, load_scenarios(scenarios_file, ADAPTERS))
    worker = start_worker("gpu", extra_env={"VIDLORA_WORKER_NAME": "test-feedback-loop", **env})
    try:
        worker.wait_ready(timeout=600)
        yield {"work": work, "env": env, "worker": worker}
    finally:
        worker.stop()
        with session_scope() as session:
            sync_from_settings(session, get_settings())


def cli(env: dict, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    run = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env},
                         capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    return run


def analysed(batch_id: int, count: int):
    from sqlalchemy import select

    from vidlora.db import session_scope
    from vidlora.models import Analysis, Result, Video

    def done():
        # In the videos' (seeded) name order, not the order they happened to finish in: the
        # same videos are approved, corrected and made gold in every run.
        with session_scope() as session:
            rows = session.execute(select(Analysis, Result).outerjoin(Result, Result.analysis_id == Analysis.id)
                                   .join(Video, Video.id == Analysis.video_id)
                                   .where(Analysis.batch_id == batch_id).order_by(Video.original_name)).all()
            finished = [(a.id, a.status, a.reason, r.id if r else None, r.adapter_version if r else None)
                        for a, r in rows if a.status in ("done", "failed", "rejected")]
            return finished if len(finished) == count else None

    rows = wait_for(done, 900, interval=2, what=f"{count} analyses of batch {batch_id}")
    assert all(status == "done" for _, status, *_ in rows), rows
    return [(result_id, version) for *_, result_id, version in rows]


def test_reviewed_answers_train_a_candidate_that_is_compared_then_promoted(loop, corpus_dir):
    from tasks.submit import submit_paths
    from vidlora.db import session_scope
    from vidlora.feedback.gold import set_gold
    from vidlora.models import Result, Scenario
    from web.review.actions import apply_review

    env, work = loop["env"], loop["work"]
    made = scenes.generate("tomb", [scenes.FRESH_SEEDS + 700 + i for i in range(VIDEOS)], corpus_dir / "loop")
    batch_id, _ = submit_paths([p for p, _ in made], [SCENARIO], "loop v1")
    results = analysed(batch_id, VIDEOS)
    v1 = results[0][1]
    assert v1 and all(version == v1 for _, version in results)
    ids = [rid for rid, _ in results]

    # Review: approve three, correct two (one more passage than the model saw), reject one;
    # one approved and one corrected answer become gold.
    with session_scope() as session:
        for i, rid in enumerate(ids):
            result = session.get(Result, rid)
            if i in (3, 4):
                apply_review(session, result, "edit", None, fields={**result.parsed, "passages": result.parsed["passages"] + 1},
                             version=result.review_version)
            else:
                apply_review(session, result, "reject" if i == 5 else "approve", None, version=result.review_version)
        for rid in (ids[0], ids[3]):
            set_gold(session.get(Result, rid), True, None)
        stored = {rid: (r.text, r.parsed, r.adapter_version) for rid in ids for r in [session.get(Result, rid)]}

    export = work / "export"
    out = cli(env, "cli", "export-training", SCENARIO, "--out", str(export))
    assert "3 example(s)" in out.stdout  # two approved + one edited; gold held out, rejected left out
    manifest = json.loads((export / "manifest.json").read_text())
    assert manifest["adapter_versions"] == {v1: 3} and manifest["by_review_state"] == {"approved": 2, "edited": 1}
    assert manifest["chat_template_prompt"] and "<|im_start|>" in manifest["chat_template_prompt"]

    v2_dir = work / "tomb_v2"
    out = cli(env, "demo_model.finetune", "--data", str(export), "--adapter",
              str(ROOT / "demo_model" / "weights" / "adapters" / "tomb_structure"), "--out", str(v2_dir), "--steps", "3")
    trained = json.loads(out.stdout.strip().splitlines()[-1])
    assert trained["examples"] == 3 and len(trained["losses"]) == 3

    out = cli(env, "cli", "scenarios", "register", SCENARIO, str(v2_dir), "--note", "3 steps on the December reviews")
    assert "registered as a candidate" in out.stdout and "answered 2 of 2 gold videos" in out.stdout
    v2 = out.stdout.split("adapter version ")[1].split()[0]
    assert v2 != v1

    comparison = json.loads(cli(env, "cli", "eval", SCENARIO, "--compare", v2[:12], "--json").stdout)
    assert (comparison["gold"], comparison["candidate_answered"], comparison["stored_versions"]) == (2, 2, {v1: 2})
    passages = next(f for f in comparison["fields"] if f["field"] == "passages")
    assert passages["stored"]["of"] == 2 and passages["candidate"]["of"] == 2
    assert passages["stored"]["right"] == 1  # the stored answer missed the corrected passage
    for change in comparison["changed"]:
        assert {"stored", "candidate", "reviewed"} <= set(change)
    with session_scope() as session:  # the candidate's run touched no stored result
        assert {rid: (r.text, r.parsed, r.adapter_version) for rid in ids for r in [session.get(Result, rid)]} == stored
    text = cli(env, "cli", "eval", SCENARIO, "--compare", v2[:12]).stdout
    assert "whole answers right" in text and "passages" in text
    report("Feedback loop: candidate v2 (3 steps on 3 reviewed answers) vs v1 on the gold set", text)

    # A bad candidate shows as one: another scenario's adapter, registered without a gold run,
    # is run by `eval --compare` and changes the gold answers for the worse.
    wrong = ROOT / "demo_model" / "weights" / "adapters" / "murals_inscriptions"
    out = cli(env, "cli", "scenarios", "register", SCENARIO, str(wrong), "--no-gold-run")
    bad = out.stdout.split("adapter version ")[1].split()[0]
    worse = json.loads(cli(env, "cli", "eval", SCENARIO, "--compare", bad[:12], "--json").stdout)
    assert worse["candidate_answered"] == 2 and worse["changed"], worse
    chambers = next(f for f in worse["fields"] if f["field"] == "chamber_count")
    assert chambers["candidate"]["right"] < chambers["stored"]["right"] == 2, chambers
    assert worse["answers_right"]["candidate"]["count"] < worse["answers_right"]["stored"]["count"]

    # A candidate the engine refuses (issue 61): v1 with its B matrices scaled to nothing loads
    # and changes nothing. register says so in words, not as answers; promote refuses it.
    import shutil

    from safetensors.torch import load_file, save_file

    noop = work / "tomb_noop"
    shutil.copytree(ROOT / "demo_model" / "weights" / "adapters" / "tomb_structure", noop)
    weights = load_file(noop / "adapter_model.safetensors")
    save_file({k: v * 1e-9 if "lora_B" in k else v for k, v in weights.items()}, noop / "adapter_model.safetensors")
    out = cli(env, "cli", "scenarios", "register", SCENARIO, str(noop))
    assert "answered 0 of 2 gold videos; 2 refused: adapter changes nothing" in out.stdout, out.stdout
    assert "promote would refuse it" in out.stderr
    nothing = out.stdout.split("adapter version ")[1].split()[0]
    refused = subprocess.run([sys.executable, "-m", "cli", "scenarios", "promote", SCENARIO, nothing[:12]], cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT), **env}, capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 1 and "2 refused: adapter changes nothing" in refused.stderr, refused.stderr

    cli(env, "cli", "scenarios", "promote", SCENARIO, v2[:12])
    fresh = scenes.generate("tomb", [scenes.FRESH_SEEDS + 790], corpus_dir / "loop-after")
    after = analysed(submit_paths([p for p, _ in fresh], [SCENARIO], "loop v2")[0], 1)
    assert after[0][1] == v2  # new analyses run with v2
    with session_scope() as session:
        assert {session.get(Result, rid).adapter_version for rid in ids} == {v1}  # old results keep v1

    agreement = json.loads(cli(env, "cli", "eval", SCENARIO, "--json").stdout)
    by_version = {v["version"]: v for v in agreement["versions"]}
    assert by_version[v1]["reviewed"] == 6 and by_version[v2]["results"] == 1

    cli(env, "cli", "scenarios", "rollback", SCENARIO)
    with session_scope() as session:
        assert session.query(Scenario).filter_by(name=SCENARIO).one().adapter_version == v1
    listed = cli(env, "cli", "scenarios", "versions", SCENARIO).stdout
    assert f"{v2}  retired" in listed and f"{v1}  serving" in listed and f"{bad}  candidate" in listed
