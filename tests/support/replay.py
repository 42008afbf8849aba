"""Is a stored result what the engine computes for its request?

A streamed result shares every engine step with whatever else was in flight, and bf16
arithmetic rounds differently for a different running set, so a run alone may part from it
where the model's top two tokens are within rounding of each other. ``check_reproduced`` runs
the request alone (greedy, top-2 logprobs, the same grammar) and demands the stored tokens,
or a parting at a near tie: at the first differing position the stored token is the alone
run's runner-up, within ``tol`` nats of its top token. Anything else (another adapter, another
input, a corrupted engine) parts at once and by far more.
"""
from __future__ import annotations

NEAR_TIE_NATS = 0.25  # engine_patch.verify's max floor for bf16 noise on this model


def check_reproduced(host, req, stored_tokens: list[int], stored_text: str, tol: float = NEAR_TIE_NATS) -> str | None:
    """None if ``stored_tokens`` are reproduced (up to a near tie); else what differs."""
    from tasks.analysis_rows import storable_text
    from vidlora.engine_io import build_input, sampling_params

    params = sampling_params(req)
    params.logprobs = 2
    lora = host.lora_request(req.adapter_name, req.adapter_path) if req.adapter_name else None
    [out] = host.llm.generate([build_input(host.tokenizer, req)], params, lora_request=lora, use_tqdm=False)
    comp = out.outputs[0]
    ids = list(comp.token_ids)
    if ids == list(stored_tokens):
        return None if storable_text(comp.text) == stored_text else "same tokens, other text"
    j = next((i for i, (a, b) in enumerate(zip(ids, stored_tokens)) if a != b), min(len(ids), len(stored_tokens)))
    if j >= len(ids) or j >= len(stored_tokens):
        return f"one is a prefix of the other ({len(ids)} vs {len(stored_tokens)} tokens)"
    top = comp.logprobs[j]
    stored_lp = top.get(stored_tokens[j])
    if stored_lp is None:
        return f"parts at token {j}: the stored token is not among the alone run's top two"
    margin = top[ids[j]].logprob - stored_lp.logprob
    return None if margin <= tol else f"parts at token {j} with a margin of {margin:.3f} nats (> {tol})"
