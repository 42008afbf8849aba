"""The GPU worker's engine thread handing results over: stored on the thread itself (the tree
before) or queued for the result writer (now), side by side in one run, on real PostgreSQL.

The engine thread alternates between waiting for the GPU (a step; the interpreter lock is free
then, as in a CUDA synchronisation) and handing over what finished. Here a step is a sleep of
``--step-s`` (default 1/10.8 s: one result per step at the ~10.8 results/s one H200 streams at the
shipped scenarios' shape), and each step hands over one result through the worker's own store
path (``tasks.analysis_rows.store_or_fail``, with the retry the worker wraps around it). What
is measured is the time the engine thread spends handing over, per result, which the GPU would
wait through, and the rate the loop reaches.

    python -m bench.result_store --results 120 --rounds 3 --json bench/results/result_store.json

It makes a database of its own on the PostgreSQL server at ``--admin-url`` and drops it after.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from contextlib import ExitStack
from pathlib import Path

DEFAULT_ADMIN = os.environ.get("VIDLORA_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def output(aid: int):
    from vidlora.engine_io import AnalysisOutput

    text = ("The vessel is a bronze ding with three legs and taotie masks on its belly; an inscription of "
            "eleven characters runs inside the rim. ") * 4
    return AnalysisOutput(request_key=str(aid), text=text, token_ids=list(range(256)), prompt_tokens=356,
                          output_tokens=256, latency_s=21.0, finish_reason="stop", cumulative_logprob=-40.0,
                          health={"ok": True, "reason": None, "checks": {}}, structured=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--admin-url", default=DEFAULT_ADMIN)
    ap.add_argument("--results", type=int, default=120)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--step-s", type=float, default=1 / 10.8)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)

    from bench.scratch_db import scratch_database

    scratch = ExitStack()
    scratch.enter_context(scratch_database(a.admin_url))
    try:
        from bench.alternate import alternate
        from tasks.analysis_rows import store_or_fail
        from tests.support.running_rows import running_analyses
        from tasks.gpu_stream import ResultWriter, _retrying
        from vidlora import db, scenarios
        from vidlora.config import reset_settings

        reset_settings()
        db.upgrade()
        scenarios.sync()
        identity = {"model": "base", "versions": {"vllm": "0.33.0"}, "engine_batch": list(range(256)),
                    "adapters": {f"s{i}": {"ok": True, "digest": "0" * 16, "reason": None} for i in range(3)}}
        never = lambda: False  # noqa: E731

        def run(mode: str, tag: str) -> dict:
            ids = running_analyses(a.results, tag, worker="bench")
            writer = ResultWriter(never, 256) if mode == "result writer" else None
            if writer:
                writer.start()
            handing = 0.0
            t0 = time.perf_counter()
            for aid in ids:
                time.sleep(a.step_s)  # the GPU step
                h0 = time.perf_counter()
                out = output(aid)
                if writer:
                    writer.put(out, identity)
                else:
                    _retrying(lambda: store_or_fail(out, identity), never)
                handing += time.perf_counter() - h0
            loop_s = time.perf_counter() - t0
            if writer:
                writer.close()
            stored_s = time.perf_counter() - t0
            with db.session_scope() as session:
                from sqlalchemy import func, select

                from vidlora.models import Analysis

                done = session.scalar(select(func.count()).where(Analysis.id.in_(ids), Analysis.status == "done"))
            assert done == len(ids), (mode, done)
            return {"mode": mode, "results": len(ids), "engine_thread_ms_per_result": round(1000 * handing / len(ids), 2),
                    "loop_results_per_s": round(len(ids) / loop_s, 2), "all_stored_s": round(stored_s, 2)}

        rows, mean = alternate(("engine thread stores", "result writer"), a.rounds, run, "engine_thread_ms_per_result")
        print(f"ENGINE THREAD per result handed over: {mean['engine thread stores']:.2f} ms -> "
              f"{mean['result writer']:.2f} ms")
        if a.json:
            Path(a.json).write_text(json.dumps({
                "command": f"python -m bench.result_store --results {a.results} --rounds {a.rounds}",
                "step_s": a.step_s, "rows": rows,
                "mean_engine_thread_ms_per_result": mean}, indent=1) + "\n")
    finally:
        scratch.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
