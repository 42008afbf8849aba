"""Skip decoding every returned logprob's token to text, for requests that never read it.

vLLM's output processor turns each logprob it returns into a `Logprob` whose token is decoded to
text (`LogprobsProcessor._update_sample_logprobs`: one or more tokenizer decodes per position
per request). vidlora's guard reads the values, never that text; with 256 requests in flight
the decoding was the largest host cost of a decode step on the CPU engine
(`bench/results/logprob_text_cpu.md`), and the GPU waits on that host.

A request opts out with `SamplingParams(extra_args={"vidlora_logprob_text": False})`
(`vidlora.engine_io.sampling_params` does): its logprobs processor gets no tokenizer, so each
`Logprob.decoded_token` is None. Its output text is detokenized as before, and every other
request is untouched.
"""
from __future__ import annotations

import importlib
import inspect

from .base import Patch, is_marked, wraps_marked

KEY = "vidlora_logprob_text"
_CLS = ("vllm.v1.engine.logprobs", "LogprobsProcessor")


def wants_text(sampling_params) -> bool:
    return (getattr(sampling_params, "extra_args", None) or {}).get(KEY, True) is not False


def _wrap(orig):
    @wraps_marked(orig)
    def from_new_request(cls, tokenizer, request):
        if request.sampling_params is not None and not wants_text(request.sampling_params):
            tokenizer = None
        return orig(cls, tokenizer=tokenizer, request=request)

    return from_new_request


def _target():
    return getattr(importlib.import_module(_CLS[0]), _CLS[1])


def probe() -> str | None:
    try:
        cls = _target()
    except (ImportError, AttributeError) as exc:
        return f"layout differs: {exc!r}"
    fn = cls.__dict__.get("from_new_request")
    if not isinstance(fn, classmethod):
        return "LogprobsProcessor.from_new_request is not a classmethod here"
    if is_marked(fn.__func__):
        return "already applied"
    params = list(inspect.signature(fn.__func__).parameters)
    if params[:3] != ["cls", "tokenizer", "request"]:
        return f"from_new_request takes {params}"
    return None


def apply() -> None:
    cls = _target()
    cls.from_new_request = classmethod(_wrap(cls.__dict__["from_new_request"].__func__))


PATCH = Patch(
    name="logprob_text",
    covers="host cost: each returned logprob's token decoded to text, which vidlora never reads",
    probe=probe,
    apply=apply,
)
