"""Reading vLLM's outputs into vidlora's: one ``AnalysisOutput`` per request, with the guard's
verdict on it as the result health, and which errors are the request's own fault."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from engine_patch.guard import Verdict
from vidlora.engine_io import AnalysisOutput, AnalysisRequest, chosen_logprobs
from vidlora.result_health import ResultHealth
from workers.confidence import with_confidence


def input_errors() -> tuple[type[BaseException], ...]:
    # vLLM 0.32's VLLMValidationError (prompt too long...) is not a ValueError.
    errors: list[type[BaseException]] = [ValueError, TypeError]
    try:
        from vllm.exceptions import VLLMClientError

        errors.append(VLLMClientError)
    except ImportError:
        pass
    return tuple(errors)


def external_id(internal_id: str) -> str:
    # vLLM 0.32 makes internal ids "<external>-<8 random chars>" (InputProcessor
    # .assign_request_id); RequestOutput carries the external one. Without randomisation
    # (VLLM_DISABLE_REQUEST_ID_RANDOMIZATION) they are equal and purely numeric.
    return internal_id.rsplit("-", 1)[0] if "-" in internal_id else internal_id


def to_output(request_key: str, out: Any, latency: float) -> AnalysisOutput:
    comp = out.outputs[0]
    token_ids = list(comp.token_ids)
    logprobs = chosen_logprobs(token_ids, comp.logprobs)
    return AnalysisOutput(
        request_key=request_key,
        text=comp.text,
        token_ids=token_ids,
        prompt_tokens=len(out.prompt_token_ids or []),
        output_tokens=len(token_ids),
        latency_s=latency,
        finish_reason=str(comp.finish_reason or "unknown"),
        cumulative_logprob=(None if comp.cumulative_logprob is None
                            else float(comp.cumulative_logprob)),
        logprobs=logprobs,
        error=None,
    )


def finish_output(req: AnalysisRequest, out: AnalysisOutput | None, verdict: Verdict,
                  tokenizer: Any = None) -> AnalysisOutput:
    """The output the caller gets: the guard's health on it, ``error`` set unless healthy, and
    a structured answer's per-field confidences (``workers.confidence``; needs ``tokenizer``)."""
    if out is None:  # refused without running (a quarantined adapter)
        out = AnalysisOutput.failed(req.request_key, verdict.reason or "refused by the guard")
    health = ResultHealth.of(verdict.as_health())
    if not verdict.judged:
        health = replace(health, reason=out.error)
    error = out.error or (None if verdict.ok else f"degenerate output: {verdict.reason}")
    return with_confidence(tokenizer, req, replace(out, error=error, health=health.as_dict()))
