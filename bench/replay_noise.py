"""How far does a streamed result drift from the same request run alone?

The pipeline tests (tests/support/replay.py) accept a stored result that parts from its run
alone only at a near tie. This measures the drift that yardstick must absorb, on the tiny CPU
model and the shipped scenarios' adapters and schemas: 6 synthetic 8-frame videos x 3
scenarios (18 requests, greedy, structured output).

1. Alone, twice (the second run hits the prefix cache): the same tokens and logprobs?
2. One closed batch of all 18 against alone.
3. ``--trials`` streams through ``EngineHost.submit`` / ``step`` as the GPU worker drives it:
   the 18 requests in a shuffled order, 0-3 admitted before each engine step. For each
   request: identical, or where it parts, by how much (the alone run's top-2 margin).

    VLLM_ENABLE_V1_MULTIPROCESSING=0 .venv/bin/python bench/replay_noise.py --trials 5 \
        --out bench/results/replay_noise.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TIMESTAMPS = [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]


def make_frames(d: Path, seed: int) -> list[str]:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for i in range(len(TIMESTAMPS)):
        y, x = np.mgrid[0:256, 0:256]
        img = np.stack([(x + 20 * i + 7 * seed) % 256, (y * 2) % 256, (x + y) % 256], -1).astype(np.uint8)
        img = np.clip(img + rng.integers(0, 30, img.shape), 0, 255).astype(np.uint8)
        p = d / f"{seed}_{i:02d}.jpg"
        Image.fromarray(img).save(p, quality=90)
        out.append(str(p))
    return out


def drift(alone, ids: list[int], logprobs: list[float]) -> dict:
    """Where ``ids`` parts from the alone output, and the largest chosen-token logprob change
    on the tokens both share."""
    n = 0
    while n < min(len(ids), len(alone.token_ids)) and ids[n] == alone.token_ids[n]:
        n += 1
    diffs = [abs(a - b) for a, b in zip(alone.logprobs[:n], logprobs[:n])]
    # By position too: drift that grows along the answer is accumulated rounding (a recurrent
    # state summed in a different order), not state carried in from another request.
    by_pos = {f"{k}-{k + 127}": round(max(diffs[k:k + 128]), 4) for k in range(0, len(diffs), 128)}
    return {"agreed": n, "tokens": len(alone.token_ids), "parts": n < max(len(ids), len(alone.token_ids)),
            "max_dlogprob_shared": round(max(diffs or [0.0]), 4), "max_dlogprob_by_position": by_pos}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(ROOT / "var" / "tiny-model"))
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--free-text", action="store_true",
                    help="no output schema: answers run to --max-tokens (the schemas end them in under 100)")
    ap.add_argument("--scenario-penalty", action="store_true",
                    help="each scenario's own repetition_penalty (1.3 in scenarios.yaml; the runs before used 1.0)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    from vidlora.config import Settings
    from vidlora.engine_io import AnalysisRequest, chosen_logprobs
    from tests.support.replay import run_alone
    from vidlora.scenarios import Generation, load_scenarios
    from workers.engine_host import EngineHost
    from workers.engine_outputs import external_id

    model = Path(a.model)
    work = Path(tempfile.mkdtemp(prefix="replay-noise-"))
    s = Settings(var_dir=work, model=str(model / "base"), adapter_root=model / "adapters")
    specs = load_scenarios(s.scenarios_file, s.adapter_root)[:3]
    reqs = [AnalysisRequest(
        request_key=f"v{v}-{sp.name}", prompt=sp.prompt, system=getattr(sp, "system", None),
        frames=make_frames(work, v), timestamps=TIMESTAMPS, adapter_name=sp.name,
        adapter_path=str(model / "adapters" / sp.name), max_tokens=a.max_tokens, temperature=0.0, top_p=1.0,
        seed=None, output_schema=None if a.free_text else getattr(sp, "output_schema", None),
        repetition_penalty=Generation.of(sp.generation).repetition_penalty if a.scenario_penalty else 1.0)
        for v in range(6) for sp in specs]
    host = EngineHost(s)
    host.start()
    alone = {r.request_key: host.generate([r])[0] for r in reqs}
    # The alone run's top logprobs at every position, as the pipeline tests' replay takes them:
    # the margin by which a stream's parting token lost there (vLLM's raw logprobs, taken
    # before the repetition penalty).
    tops = {r.request_key: run_alone(host, r) for r in reqs}
    again = {r.request_key: host.generate([r])[0] for r in reqs}
    host.reset_prefix_cache()
    batch = {o.request_key: o for o in host.generate(reqs)}
    report = {
        "alone_again_prefix_cached": [{"request": k, **drift(alone[k], o.token_ids, o.logprobs)} for k, o in again.items()],
        "closed_batch_of_18": [{"request": k, **drift(alone[k], o.token_ids, o.logprobs)} for k, o in batch.items()],
        "streams": [],
    }
    for trial in range(a.trials):
        rnd = random.Random(trial)
        pending = reqs[:]
        rnd.shuffle(pending)
        key_of, done = {}, {}
        while len(done) < len(reqs):
            for _ in range(rnd.randint(0, 3)):
                if pending:
                    r = pending.pop(0)
                    key_of[external_id(host.submit(r))] = r.request_key
            for out in host.step():
                done[key_of[out.request_id]] = out
        for key, out in done.items():
            comp = out.outputs[0]
            row = drift(alone[key], list(comp.token_ids), chosen_logprobs(list(comp.token_ids), comp.logprobs))
            if row["parts"] and row["agreed"] < min(len(comp.token_ids), len(tops[key].token_ids)):
                j, ref = row["agreed"], tops[key]
                top = ref.logprobs[j]
                mine = top.get(comp.token_ids[j])
                row["margin_at_parting"] = None if mine is None else round(top[ref.token_ids[j]].logprob - mine.logprob, 4)
            report["streams"].append({"trial": trial, "request": key, **row})
    summary = {}
    for name in ("alone_again_prefix_cached", "closed_batch_of_18", "streams"):
        rows = report[name]
        summary[name] = {"requests": len(rows), "parted": sum(r["parts"] for r in rows),
                         "max_dlogprob_shared": max(r["max_dlogprob_shared"] for r in rows),
                         "max_dlogprob_by_position": {k: max(r["max_dlogprob_by_position"].get(k, 0.0) for r in rows)
                                                      for k in sorted({k for r in rows for k in r["max_dlogprob_by_position"]},
                                                                      key=lambda k: int(k.split("-")[0]))},
                         "tokens_max": max(r["tokens"] for r in rows),
                         "partings": sorted({f'{r["request"]} at token {r["agreed"]}' for r in rows if r["parts"]}),
                         "margins_at_partings": sorted({r["margin_at_parting"] for r in rows
                                                        if r.get("margin_at_parting") is not None})}
    report["summary"] = summary
    print(json.dumps(summary, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps({"command": "bench/replay_noise.py " + " ".join(argv or sys.argv[1:]),
                                           **report}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
