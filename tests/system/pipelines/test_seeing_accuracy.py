"""The demo model sees (issue 16): generated scenes whose contents are known go through the
real pipeline (submit -> Celery -> H.264 decode and each scenario's sampling -> vLLM with
LoRA -> PostgreSQL), and the stored answers are scored against the truth.

- Each shipped scenario, served with its own adapter, answers at least 90% of 30 fresh videos
  (seeds no training run reaches) right.
- Served with another scenario's adapter, or with none, it is near chance: the knowledge is
  in the adapters, not the base.
- Mixing the three scenarios in one engine batch changes no answer (the worker groups by
  adapter; the replay puts them all in one batch, interleaved).
- Merged weights (PEFT merge_and_unload, no LoRA at run time) give the same answers, so the
  same accuracy: dynamic LoRA on the GDN hybrid is what it claims to be.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from tests.support.reports import report
from tests.support.workers import wait_for
from vidlora import scenes

pytestmark = pytest.mark.engine

VIDEOS_PER_KIND = 30
GOAL = 0.9  # the issue's: at least 27 of 30
# Chance: one of 64 artifacts, of 4 chamber counts, of 216 inscriptions. "Near" it leaves
# room for a lucky streak in 30 videos, and nothing more.
CHANCE = {"artifact": 1 / 64, "tomb": 1 / 4, "mural": 1 / 216}
NEAR_CHANCE = 0.2
WRONG = {"artifact": "tomb_structure", "tomb": "murals_inscriptions", "mural": "artifact_identification"}


def _variants(shipped: Path, adapters: Path, out: Path) -> Path:
    """The shipped scenarios three times over: with their own adapter, with another scenario's,
    and with none (names ``<scenario>-own`` / ``-wrong`` / ``-none``); prompts, sampling,
    schemas and generation settings exactly as shipped."""
    entries = []
    for entry in yaml.safe_load(shipped.read_text())["scenarios"]:
        kind = scenes.KIND_OF.get(entry["name"])
        if kind is None:
            continue
        for variant, adapter in (("own", entry["name"]), ("wrong", WRONG[kind]), ("none", None)):
            e = dict(entry, name=f"{entry['name']}-{variant}")
            e.pop("slo", None)
            if adapter:
                e["adapter"] = str(adapters / adapter)
            else:
                e.pop("adapter", None)
            entries.append(e)
    out.write_text(yaml.safe_dump({"scenarios": entries}, sort_keys=False))
    return out


@pytest.fixture(scope="module")
def seeing(start_worker, cpu_worker, tmp_path_factory):
    """A GPU worker serving the demo model and the scenario variants; the test database's
    scenarios are put back as the other modules expect afterwards."""
    from demo_model import ADAPTERS, BASE
    from vidlora.config import PROJECT_ROOT, get_settings
    from vidlora.db import session_scope
    from vidlora.scenarios import load_scenarios, sync_from_settings, sync_scenarios

    work = tmp_path_factory.mktemp("seeing")
    scenarios_file = _variants(PROJECT_ROOT / "scenarios.yaml", ADAPTERS, work / "scenarios.yaml")
    with session_scope() as session:
        sync_scenarios(session, load_scenarios(scenarios_file, ADAPTERS))
    worker = start_worker("gpu", extra_env={
        "VIDLORA_WORKER_NAME": "test-seeing", "VIDLORA_MODEL": str(BASE),
        "VIDLORA_ADAPTER_ROOT": str(ADAPTERS), "VIDLORA_SCENARIOS_FILE": str(scenarios_file)})
    try:
        worker.wait_ready(timeout=600)
        yield {"worker": worker, "work": work}
    finally:
        worker.stop()
        with session_scope() as session:
            sync_from_settings(session, get_settings())


def test_each_adapter_reads_its_scenes_and_only_its_own(seeing, corpus_dir):
    from tasks.submit import submit_paths

    made = {kind: scenes.generate(kind, [scenes.FRESH_SEEDS + 100 + i for i in range(VIDEOS_PER_KIND)],
                                  corpus_dir / "seeing")
            for kind in scenes.KINDS}
    truth = {path.name: scene for videos in made.values() for path, scene in videos}
    batches = [submit_paths([p for p, _ in made[kind]], [f"{scenes.SCENARIO_OF[kind]}-{v}" for v in ("own", "wrong", "none")],
                            f"seeing {kind}")[0] for kind in scenes.KINDS]
    expected = 3 * VIDEOS_PER_KIND * len(batches)

    def finished():
        rows = _rows(batches)
        return len(rows) == expected and all(a.status in ("done", "failed", "rejected") for a, *_ in rows) and rows

    rows = wait_for(finished, 1500, interval=3, what=f"{expected} analyses")
    failures = [(a.id, s.name, a.status, a.reason) for a, s, r, _ in rows if a.status != "done"]
    assert not failures, failures[:5]

    score: dict[tuple[str, str], list[bool]] = {}
    for a, s, r, video_name in rows:
        scenario, variant = s.name.rsplit("-", 1)
        scene = truth[video_name]
        assert scene.scenario == scenario
        score.setdefault((scene.kind, variant), []).append(scenes.correct(scene, r.parsed))
    accuracy = {key: sum(v) / len(v) for key, v in score.items()}
    _report(accuracy)
    for kind in scenes.KINDS:
        assert accuracy[(kind, "own")] >= GOAL, (kind, accuracy)
        assert accuracy[(kind, "wrong")] <= CHANCE[kind] + NEAR_CHANCE, accuracy
        assert accuracy[(kind, "none")] <= CHANCE[kind] + NEAR_CHANCE, accuracy

    # Replays run engines in this process: the worker's must not compete for the two cores.
    seeing["worker"].stop()
    own: dict[str, list[int]] = {}  # scenario -> its own-adapter analyses
    for a, s, *_ in sorted(rows, key=lambda row: row[0].id):
        if s.name.endswith("-own"):
            own.setdefault(s.name.removesuffix("-own"), []).append(a.id)
    stored = {a.id: r.parsed for a, s, r, _ in rows}
    requests = {i: _request_for(i) for ids in own.values() for i in ids}

    # All three scenarios in one engine batch, interleaved: no answer changes.
    mixed = [requests[i] for trio in zip(*own.values()) for i in trio]
    assert len(mixed) == 3 * VIDEOS_PER_KIND
    outs = _generate(None, mixed)
    assert {k: json.loads(o.text) for k, o in outs.items()} == {int(q.request_key): stored[int(q.request_key)]
                                                                for q in mixed}

    # Merged weights, no LoRA: the same answers, hence the same accuracy.
    from demo_model import ADAPTERS, BASE
    from engine_patch.verify import merge_adapter

    for name, ids in sorted(own.items()):
        merged = merge_adapter(BASE, ADAPTERS / name, seeing["work"] / f"merged-{name}")
        outs = _generate(merged, [dataclasses.replace(requests[i], adapter_name=None, adapter_path=None) for i in ids])
        differ = [k for k, o in outs.items() if json.loads(o.text) != stored[k]]
        assert not differ, (name, [(k, outs[k].text, stored[k]) for k in differ[:3]])


def _rows(batch_ids: list[int]):
    """(analysis, scenario, result, video file name) of every analysis of the batches."""
    from sqlalchemy import select

    from vidlora.db import session_scope
    from vidlora.models import Analysis, Result, Scenario, Video

    with session_scope() as session:
        return [tuple(row) for row in session.execute(
            select(Analysis, Scenario, Result, Video.original_name)
            .join(Scenario, Scenario.id == Analysis.scenario_id)
            .join(Video, Video.id == Analysis.video_id)
            .outerjoin(Result, Result.analysis_id == Analysis.id)
            .where(Analysis.batch_id.in_(batch_ids))).all()]


def _request_for(analysis_id: int):
    from tasks.analysis_rows import build_request
    from vidlora.config import get_settings
    from vidlora.db import session_scope
    from vidlora.models import Analysis

    with session_scope() as session:
        a = session.get(Analysis, analysis_id)
        return build_request(a.id, a.scenario, a.frame_set, get_settings().media_root)


def _generate(model: Path | None, requests) -> dict:
    """One engine batch through the product's engine host on ``model`` (default: the demo base)."""
    import gc

    from demo_model import ADAPTERS, BASE
    from vidlora.config import get_settings
    from workers.engine_env import shutdown
    from workers.engine_host import EngineHost

    settings = get_settings().model_copy(update={"model": str(model or BASE), "adapter_root": ADAPTERS,
                                                 "max_num_seqs": len(requests)})
    host = EngineHost(settings)
    host.start()
    try:
        outs = host.generate(list(requests))
    finally:
        shutdown(host.llm)
        host.llm = None
        gc.collect()
    assert all(o.error is None for o in outs), [o.error for o in outs if o.error][:3]
    return {int(o.request_key): o for o in outs}


def _report(accuracy: dict) -> None:
    lines = ["| scene | own adapter | another scenario's adapter | no adapter |", "|---|---:|---:|---:|"]
    for kind in scenes.KINDS:
        lines.append(f"| {kind} | " + " | ".join(f"{accuracy[(kind, v)]:.2f}" for v in ("own", "wrong", "none")) + " |")
    report(f"Demo model: accuracy on {VIDEOS_PER_KIND} fresh videos per scenario, through the real pipeline",
           "\n".join(lines))
