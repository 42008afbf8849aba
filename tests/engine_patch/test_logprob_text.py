"""logprob_text: a request that opts out gets its logprobs as numbers, without each token's text.

The engine-level case (the worker's own requests, through EngineHost) is in
tests/workers/test_engine_host.py; the host time it saves is `bench/logprob_text.py`.
"""
from __future__ import annotations

from types import SimpleNamespace

import engine_patch


def _processor(tokenizer, **extra):
    from vllm import SamplingParams
    from vllm.v1.engine.logprobs import LogprobsProcessor

    sp = SamplingParams(logprobs=1, extra_args=extra or None)
    return LogprobsProcessor.from_new_request(tokenizer=tokenizer, request=SimpleNamespace(sampling_params=sp))


def test_only_a_request_that_opts_out_loses_its_logprob_text():
    engine_patch.apply()
    tokenizer = object()
    assert _processor(tokenizer, vidlora_logprob_text=False).tokenizer is None
    assert _processor(tokenizer).tokenizer is tokenizer, "every other request is untouched"
    assert _processor(tokenizer, vidlora_logprob_text=True).tokenizer is tokenizer
    assert _processor(tokenizer, vidlora_logprob_text=False).cumulative_logprob == 0.0, "values still kept"
