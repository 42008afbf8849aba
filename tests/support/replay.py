"""Is a stored result what the engine computes for its request?

A streamed result shares every engine step with whatever else was in flight, and bf16
arithmetic rounds differently for a different running set, so a run alone may part from it
where the model's top two tokens are within rounding of each other. ``check_reproduced`` runs
the request alone (greedy, top-2 logprobs, the same grammar) and demands the stored tokens,
or a parting at a near tie: at the first differing position the stored token is the alone
run's runner-up, within ``tol`` nats of its top token. Anything else (another adapter, another
input, a corrupted engine) parts at once and by far more.

A late parting is told apart from those: after ``LATE_AFTER`` agreed tokens the adapter, the
input and the engine are already proven, and a parting within ``LATE_NATS`` is accepted but
warned about (``LateParting``, in the test summary). Measured on the tiny CPU model, a request
streamed beside 17 others moves its chosen-token logprobs by at most about 0.02 nats from its
run alone (``bench/results/replay_noise.md``); one CI run on 2026-12-05 saw a result part at
token 56 by 0.445 nats, which no later run reproduced. The warning keeps such a case visible.
"""
from __future__ import annotations

import warnings

NEAR_TIE_NATS = 0.25  # engine_patch.verify's max floor for bf16 noise on this model
LATE_AFTER = 32  # agreed tokens after which a parting cannot be another adapter, input or a broken engine
LATE_NATS = 2.0  # CI 2026-12-05: a 364th token parted by 1.34 nats after 363 agreed (flat tiny-model logits)


class LateParting(UserWarning):
    """A stored result parted from its run alone late and by more than a near tie."""


# Logprobs the run alone returns per position: where the tiny random model's distribution is
# flat, a late parting's stored token can be third or lower and still within rounding (a CI run
# on 2026-12-05 parted at token 351 of a long answer with it outside the top two).
TOP_K = 20  # vLLM's default max_logprobs


def run_alone(host, req):
    """``req`` alone on ``host``'s engine (greedy, its grammar and adapter), with the top
    ``TOP_K`` logprobs at every position: vLLM's completion output."""
    from vidlora.engine_io import build_input, sampling_params

    params = sampling_params(req)
    params.logprobs = TOP_K
    lora = host.lora_request(req.adapter_name, req.adapter_path) if req.adapter_name else None
    [out] = host.llm.generate([build_input(host.tokenizer, req)], params, lora_request=lora, use_tqdm=False)
    return out.outputs[0]


def check_reproduced(host, req, stored_tokens: list[int], stored_text: str, tol: float = NEAR_TIE_NATS) -> str | None:
    """None if ``stored_tokens`` are reproduced (up to a near tie); else what differs."""
    from tasks.analysis_rows import storable_text

    comp = run_alone(host, req)
    ids = list(comp.token_ids)
    if ids == list(stored_tokens):
        return None if storable_text(comp.text) == stored_text else "same tokens, other text"
    j = next((i for i, (a, b) in enumerate(zip(ids, stored_tokens)) if a != b), min(len(ids), len(stored_tokens)))
    if j >= len(ids) or j >= len(stored_tokens):
        return f"one is a prefix of the other ({len(ids)} vs {len(stored_tokens)} tokens)"
    top = comp.logprobs[j]
    stored_lp = top.get(stored_tokens[j])
    if stored_lp is None:
        return f"parts at token {j}: the stored token is not among the alone run's top {TOP_K}"
    margin = top[ids[j]].logprob - stored_lp.logprob
    if margin <= tol:
        return None
    # What a later reader needs to tell causes apart: vLLM returns raw logprobs (before the
    # repetition penalty), so a tie after the penalty reads as a gap when one of the two tokens
    # was already said and the other not.
    said = [who for who, tok in (("run alone's", ids[j]), ("stored", stored_tokens[j])) if tok in stored_tokens[:j]]
    context = (f"stored token's rank {getattr(stored_lp, 'rank', '?')}; repetition_penalty {req.repetition_penalty}; "
               f"said before: {', '.join(said) or 'neither'}")
    if j >= LATE_AFTER and margin <= LATE_NATS:
        warnings.warn(LateParting(f"{req.request_key}: parts at token {j} of {len(stored_tokens)} by {margin:.3f} nats "
                                  f"({context})"))
        return None
    return f"parts at token {j} with a margin of {margin:.3f} nats (> {tol}; {context})"
