"""The prompt tokens vLLM makes of the GPU worker's requests, in a fresh interpreter (so the
engine never shares a process with the test that asks).

    python -m tests.support.engine_prompts MODEL OUT.json < requests.json

``requests.json``: a list of ``vidlora.engine_io.AnalysisRequest`` fields, as
``tasks.analysis_rows.build_request`` made them. Each goes through ``engine_io.build_input`` (the
worker's own rendering) into the vLLM CPU engine for one token; out comes vLLM's
``prompt_token_ids`` per request, into OUT.json (vLLM logs to stdout).
"""

from __future__ import annotations

import json
import sys


def main(model: str, out_file: str) -> None:
    from vllm import LLM

    from engine_patch.verify.video import greedy
    from vidlora.engine_io import AnalysisRequest, build_input

    requests = [AnalysisRequest(**fields) for fields in json.load(sys.stdin)]
    llm = LLM(model, max_model_len=4096, enforce_eager=True, seed=0)
    tokenizer = llm.get_tokenizer()
    out = [greedy(llm, build_input(tokenizer, req), 1, [])[0] for req in requests]
    with open(out_file, "w") as fh:
        json.dump(out, fh)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
