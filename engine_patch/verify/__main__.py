"""``python -m engine_patch.verify``: the command line (the package docstring says what it proves)."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from .options import DEFAULT_LENGTHS, FLOOR_MAX, FLOOR_MEAN, K, Options
from .orchestrate import run
from .report import _jsonable, shown, table

def _exclude_own_plugin() -> None:
    """--no-patch: vLLM loads general plugins (ours applies every patch) in each process it
    builds an engine in; the plugin's own switch turns it off there too."""
    os.environ["VIDLORA_ENGINE_PATCH"] = "off"


def parse_args(argv: list[str] | None = None) -> tuple[Options, argparse.Namespace]:
    ap = argparse.ArgumentParser(prog="python -m engine_patch.verify", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--adapter", action="append", required=True, type=Path, help="PEFT adapter dir (repeat)")
    ap.add_argument("--merged", action="append", default=[], type=Path,
                    help="pre-merged model for the adapter at the same position (repeat); default: merge with PEFT")
    ap.add_argument("--lengths", default=",".join(map(str, DEFAULT_LENGTHS)))
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--dtype", default="bfloat16", help="vLLM dtype (the served one)")
    ap.add_argument("--ref-dtype", default="float32")
    ap.add_argument("--ref-device", default=None, help="default: cuda if available, else cpu")
    ap.add_argument("--no-patch", action="store_true", help="plain vLLM: no engine_patch.apply(), raw adapters, plugin off")
    ap.add_argument("--raw-adapters", action="store_true", help="hand every variant the adapters as given (skip the adapter registry)")
    ap.add_argument("--checks", default=None,
                    help="subset of a (accuracy), b (mixed batches), c (long-then-short), d (no-adapter request: "
                         "LoRA engine vs no-LoRA engine); default a,b,c,d (--video: a)")
    ap.add_argument("--llm-kwargs", default="{}", help='extra vllm.LLM kwargs as JSON, e.g. {"gdn_prefill_backend": "triton"}')
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--workdir", type=Path, default=None, help="keep merged models etc. here")
    ap.add_argument("--k", type=float, default=K)
    ap.add_argument("--floor-mean", type=float, default=FLOOR_MEAN)
    ap.add_argument("--floor-max", type=float, default=FLOOR_MAX)
    ap.add_argument("--video", nargs="?", const="", default=None, metavar="PATH",
                    help="video mode: check (a) on a chat-templated video request (PATH, or a generated sample clip)")
    ap.add_argument("--video-frames", type=int, default=4, help="frames sampled uniformly (the sampling policy's num_frames)")
    ap.add_argument("--video-max-pixels", type=int, default=128 * 128, help="the sampling policy's max_pixels per frame")
    a = ap.parse_args(argv)
    if a.merged and len(a.merged) > len(a.adapter):
        ap.error("more --merged than --adapter")
    video = a.video is not None
    checks = tuple(x.strip() for x in (a.checks or ("a" if video else "a,b,c,d")).split(",") if x.strip())
    if video and checks != ("a",):
        ap.error("--video runs check a only (mixed batches and long-then-short are text-mode checks)")
    o = Options(model=a.model, adapters=a.adapter, merged=a.merged,
                lengths=tuple(int(x) for x in a.lengths.split(",") if x.strip()),
                max_new_tokens=a.max_new_tokens, dtype=a.dtype, ref_dtype=a.ref_dtype, ref_device=a.ref_device,
                patch=not a.no_patch, prepare=not (a.no_patch or a.raw_adapters), checks=checks,
                llm_kwargs=json.loads(a.llm_kwargs), workdir=a.workdir, k=a.k,
                floor_mean=a.floor_mean, floor_max=a.floor_max, video=video,
                video_path=Path(a.video) if a.video else None, video_frames=a.video_frames,
                video_max_pixels=a.video_max_pixels)
    return o, a


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    o, a = parse_args(argv)
    if not o.patch:
        _exclude_own_plugin()
    import torch

    if not torch.cuda.is_available():
        # CPU: one process; spawning the engine core re-imports vLLM per engine (~40 s each).
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from ..env import versions

    t0 = time.time()
    if o.video:
        from .video import run_video

        res = run_video(o)
    else:
        res = run(o)
    res["ok"] = not res["failures"] and not res["errors"]
    res["command"] = "python -m engine_patch.verify " + " ".join(sys.argv[1:] if argv is None else argv)
    res["versions"] = versions()
    res["config"] = {"model": shown(o.model), "adapters": [shown(p) for p in o.adapters],
                     "merged": [shown(p) for p in o.merged], "mode": "video" if o.video else "text",
                     "lengths": [] if o.video else list(o.lengths), "max_new_tokens": o.max_new_tokens,
                     "dtype": o.dtype, "ref_dtype": o.ref_dtype, "patch": o.patch, "prepare_adapter": o.prepare,
                     "checks": list(o.checks), "llm_kwargs": o.llm_kwargs}
    if o.video:
        res["config"].update(video=shown(o.video_path) if o.video_path else "generated sample",
                             video_frames=o.video_frames, video_max_pixels=o.video_max_pixels)
    res["tolerance"] = {
        "k": o.k, "floor_mean": o.floor_mean, "floor_max": o.floor_max,
        "rule": "dyn~ref passes iff finite, mean <= max(floor_mean, k*noise_mean(L)) and max <= max(floor_max, "
                "k*noise_max(L)); noise(L) = max(merged~ref, base~base_ref) at L; merged~ref must itself be within "
                "the base-noise tolerance; mixed batches, long-then-short and no-adapter LoRA-vs-no-LoRA engine use the base-noise tolerance at the "
                "nearest length, and generated tokens may part only where the single run's top-1/top-2 margin <= tol_max",
        "why": "merged-in bf16 weights are the most faithful bf16 rendering of an adapter, so their error against the "
               "fp32 PEFT reference is the bf16 noise at that length; dynamic LoRA rounds differently (same order); "
               "defects (aliased slot, dropped module, wrong scale, NaN) are of the size of the adapter effect, >> k*noise",
    }
    res["wall_s"] = round(time.time() - t0, 1)
    print(table(res))
    for e in res["errors"]:
        print(f"ERROR {e['where']}: {e['error']}")
    for f in res["failures"]:
        print(f"FAIL {f}")
    if res.get("inconclusive"):
        print("INCONCLUSIVE (adapter effect below tolerance): " + ", ".join(res["inconclusive"]))
    if res.get("lora_paths"):
        print("LoRA module applications by path: " + ", ".join(f"{k} {v}" for k, v in res["lora_paths"].items()))
    print("VERIFY " + ("PASS" if res["ok"] else "FAIL") + f" in {res['wall_s']}s")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(_jsonable(res), indent=1))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
