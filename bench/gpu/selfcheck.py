"""The GPU worker's start-up checks (engine_patch.startup_checks, issue 36) on this device.

    python -m bench.gpu.selfcheck --model M --adapter A [--adapter B ...] [--eager] [--dummy]
        [--llm-kwargs '{"gdn_prefill_backend": "triton"}'] --json out.json

Through the worker's own ``EngineHost``: the engine it builds, the one adapter registration,
``startup_checks`` and the worker's reaction to a failure (an adapter refused, the eager
rebuild, the refusal to start). ``gpukit/stages.sh selfcheck`` runs it on the tiny model
(CUDA graphs and eager) and on the 27B-shape dummy engine.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine_patch.startup_checks import StartupCheckError, jsonable  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.gpu.selfcheck --model M --adapter A ... [--json out]``: the
    worker's engine (``EngineHost``, its registration and its reaction to a failure) on this
    device, the checks' report as JSON. Exit 0: the worker would serve; 1: it would refuse."""
    import argparse

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    ap = argparse.ArgumentParser(prog="python -m bench.gpu.selfcheck", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--adapter", action="append", default=[], help="PEFT adapter dir (repeat)")
    ap.add_argument("--max-loras", type=int, default=4)
    ap.add_argument("--max-lora-rank", type=int, default=64)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--eager", action="store_true", help="enforce_eager (default: CUDA graphs, as the worker)")
    ap.add_argument("--dummy", action="store_true",
                    help="load_format=dummy (a shape-only model): the adapter-effect and canary checks of "
                         "registration cannot judge noise, so only the comparisons (a, c) decide")
    ap.add_argument("--llm-kwargs", default="{}", help="extra vllm.LLM kwargs as JSON")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

    from vidlora.config import Settings
    from workers.engine_host import EngineHost

    extra = json.loads(a.llm_kwargs)
    if a.dummy:
        extra["load_format"] = "dummy"

    class Host(EngineHost):
        def engine_kwargs(self) -> dict[str, Any]:
            kw = super().engine_kwargs()
            kw["limit_mm_per_prompt"] = {"video": 0, "image": 0}  # text prompts only
            kw.update(extra)
            return kw

        if a.dummy:
            def _judge_adapter(self, lora):  # noise weights: see --dummy
                return {"startup_checks": "registration's device checks skipped: dummy weights"}, None

    roots = {os.path.dirname(os.path.abspath(p)) for p in a.adapter}
    settings = Settings(model=a.model, adapter_root=roots.pop() if len(roots) == 1 else None, max_loras=a.max_loras, max_cpu_loras=max(a.max_loras, len(a.adapter)),
                        max_lora_rank=a.max_lora_rank, max_model_len=a.max_model_len,
                        max_num_seqs=a.max_num_seqs, enforce_eager=a.eager, served_model_name="")
    host = Host(settings)
    t0 = time.perf_counter()
    host.start()
    out: dict[str, Any] = {"engine_start_s": round(time.perf_counter() - t0, 1),
                           "engine_kwargs": host.engine_kwargs(), "dummy": a.dummy}
    for path in a.adapter:
        host.register_adapter(os.path.basename(os.path.normpath(path)), path)
    out["registrations"] = {k: {"ok": v["ok"], "reason": v["reason"], "stage": v.get("stage")}
                            for k, v in host.registrations().items()}
    try:
        out["startup_checks"] = host.startup_checks()
        out["serves"] = True
    except StartupCheckError as exc:
        out["startup_checks"] = host.startup_report
        out["serves"], out["refusal"] = False, str(exc)
    out["enforce_eager_at_end"] = bool(host.settings.enforce_eager)
    out["registrations_after"] = {k: {"ok": v["ok"], "reason": v["reason"], "stage": v.get("stage")}
                                  for k, v in host.registrations().items()}
    from engine_patch.env import versions

    out["versions"] = versions()
    text = json.dumps(jsonable(out), indent=1, default=str)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    print(text[-4000:])
    print("STARTUP CHECKS " + ("PASS" if out["serves"] else "REFUSE") +
          f" in {out['startup_checks'].get('seconds') if out['startup_checks'] else '-'}s")
    return 0 if out["serves"] else 1


if __name__ == "__main__":
    sys.exit(main())
