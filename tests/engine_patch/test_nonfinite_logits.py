"""engine_patch.patches.nonfinite_logits: a NaN/+inf logits row never reaches the V2 sampler's
index arithmetic; that row samples token 0 with NaN logprobs (what the guard refuses), and every
other row of the step is untouched."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from engine_patch.patches import nonfinite_logits as nf

ROOT = Path(__file__).resolve().parents[2]


def test_rows_with_nan_or_posinf_are_bad_and_masked_rows_are_not():
    x = torch.zeros(4, 8)
    x[1, 3] = float("nan")
    x[2, 0] = float("inf")
    x[3, :4] = float("-inf")  # a logits processor's mask
    assert nf.nonfinite_rows(x).tolist() == [False, True, True, False]
    assert nf.nonfinite_rows(x.to(torch.bfloat16)).tolist() == [False, True, True, False]


def test_sanitised_rows_put_all_mass_on_token_zero_and_leave_the_rest_bit_exact():
    x = torch.randn(3, 16)
    x[1, 5] = float("nan")
    bad = nf.nonfinite_rows(x)
    y = nf.sanitise(x, bad)
    assert torch.equal(y[0], x[0]) and torch.equal(y[2], x[2])
    assert y[1, 0] == 0 and torch.isneginf(y[1, 1:]).all()
    assert int(torch.softmax(y[1], -1).argmax()) == 0 and float(torch.softmax(y[1], -1)[0]) == 1.0


def test_marked_logprobs_are_nan_only_on_bad_rows():
    from vllm.v1.outputs import LogprobsTensors

    lt = LogprobsTensors(torch.zeros(3, 2, dtype=torch.int64), -torch.ones(3, 2), torch.zeros(3, dtype=torch.int64))
    got = nf.mark_logprobs(lt, torch.tensor([False, True, False]))
    assert torch.isnan(got.logprobs[1]).all() and torch.equal(got.logprobs[[0, 2]], -torch.ones(2, 2))
    assert nf.mark_logprobs(None, torch.tensor([True])) is None


def test_real_v2_sampler_patched_samples_token_zero_for_bad_rows_only():
    # vLLM's own V2 Sampler class and Triton kernels (in Triton's interpreter: no GPU here),
    # unpatched then patched, in one subprocess (TRITON_INTERPRET must be set before import).
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "tests.support.v2_sampler"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["rows"] == ["finite", "nan", "finite", "posinf", "neginf_mask"]
    assert res["probe"] is None, res["probe"]  # this vLLM has the V2 sampler: the patch applies
    before, after = res["unpatched"], res["patched"]
    # Unpatched, the bad rows' winners come out of the NaN/inf lanes (on the H200 the NaN row's
    # winner fell past the vocabulary: bench/results/h200_field.md); patched, they are token 0.
    assert before["sampled"][1] != 0 and before["sampled"][3] != 0
    assert after["sampled"][1] == 0 and after["sampled"][3] == 0
    assert after["logprob_finite"] == [True, False, True, False, True]
    # Every other row: same token and logprob as unpatched (greedy, seeded random, masked).
    for i in (0, 2, 4):
        assert after["sampled"][i] == before["sampled"][i]
        assert after["logprob"][i] == before["logprob"][i]
