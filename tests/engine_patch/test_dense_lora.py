"""engine_patch.patches.dense_lora: the plan, and vLLM's own CPU Punica wrapper with the patch
against the same wrapper's stock methods (no engine: fast). The engine-level proof is
`engine_patch.verify` (tests/engine_patch/test_verify.py), which runs both paths."""
from __future__ import annotations

import itertools

import pytest
import torch

import engine_patch
from engine_patch.patches import dense_lora
from engine_patch.patches.dense_lora import Plan, plan_for

SLOTS = [11, 22, 33, None]  # slot -> LoRA id, as vLLM's lora_index_to_id


def test_plan_is_the_adapter_runs_with_base_runs_left_out():
    plan = plan_for((22,) * 5 + (0,) * 3 + (11,) * 2, SLOTS, max_segments=4)
    assert plan == Plan(n_tokens=10, segments=((0, 5, 1), (8, 10, 0)), runs=3)
    assert plan_for((33,) * 7, SLOTS, 1) == Plan(7, ((0, 7, 2),), 1)
    assert plan_for((0,) * 4, SLOTS, 1) == Plan(4, (), 1)


def test_plan_refuses_too_many_runs_and_unknown_ids():
    assert plan_for((11, 22, 11, 22, 11), SLOTS, max_segments=4) is None
    assert plan_for((11, 22, 11, 22), SLOTS, max_segments=4) is not None
    assert plan_for((11, 44), SLOTS, max_segments=4) is None  # 44 holds no slot


@pytest.fixture(scope="module")
def wrapper_cls():
    engine_patch.apply()
    if "dense_lora" not in (engine_patch.applied() or []):
        pytest.skip("dense_lora not applied (VIDLORA_DENSE_LORA=off?)")
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    return PunicaWrapperCPU


def _wrapper(cls, index_mapping):
    from vllm.lora.layers import LoRAMapping

    w = cls(max_num_batched_tokens=256, max_batches=16, device="cpu")
    mapping = LoRAMapping(index_mapping=tuple(index_mapping), prompt_mapping=(index_mapping[-1],), is_prefill=True)
    w.update_metadata(mapping, SLOTS, len(SLOTS), 1000)
    return w


def _weights(dtype, slices=(24, 8, 8), rank=8, hidden=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = tuple(torch.randn(len(SLOTS), 1, rank, hidden, generator=g).to(dtype) for _ in slices)
    b = tuple(torch.randn(len(SLOTS), 1, n, rank, generator=g).to(dtype) for n in slices)
    return a, b


MAPPINGS = {
    "one adapter": [22] * 13,
    "two runs and base": [33] * 6 + [0] * 4 + [11] * 5,
    "too many runs (Punica)": [11, 22, 0, 33, 11, 22, 0, 33, 11],
    "base only": [0] * 7,
    "every slot interleaved with base": [11, 0, 22, 33, 0, 11, 33, 22, 0, 22],
}
# How LoRA is applied: each eager step chooses (dense runs, or Punica past the run limit), or the
# all-slots form a CUDA graph captures (the CPU captures nothing, so `always` runs it here).
FORMS = {"per step": None, "all slots": "always"}


def _form(monkeypatch, form: str) -> None:
    if FORMS[form] is None:
        monkeypatch.delenv("VIDLORA_DENSE_LORA_GRAPHS", raising=False)
    else:
        monkeypatch.setenv("VIDLORA_DENSE_LORA_GRAPHS", FORMS[form])


def _expected_path(form: str, name: str, mapping) -> str:
    if FORMS[form]:
        return "all_slots"
    if "Punica" in name or len(list(itertools.groupby(mapping))) > dense_lora.DEFAULT_MAX_SEGMENTS:
        return "punica"
    return "base" if set(mapping) == {0} else "dense"


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(MAPPINGS))
def test_packed_linear_matches_stock_punica(wrapper_cls, monkeypatch, name, dtype, form):
    """add_lora_linear (column-parallel and packed layers: per-slice tuple buffers)."""
    mapping = MAPPINGS[name]
    a, b = _weights(dtype)
    x = torch.randn(len(mapping), 32, generator=torch.Generator().manual_seed(1)).to(dtype)
    base_out = torch.randn(len(mapping), sum(t.shape[2] for t in b)).to(dtype)
    slices = tuple(t.shape[2] for t in b)

    stock = _wrapper(wrapper_cls, mapping)
    want = base_out.clone()
    bufs = tuple(torch.zeros(len(mapping), 8) for _ in slices)
    type(stock).add_shrink.__vidlora_orig__(stock, bufs, x, a, 1.0)
    type(stock).add_expand.__vidlora_orig__(stock, want, bufs, b, slices, add_inputs=True)

    _form(monkeypatch, form)
    before = dense_lora.counts()
    got = base_out.clone()
    _wrapper(wrapper_cls, mapping).add_lora_linear(got, x, a, b, 1.0, slices)
    ran = {k: v - before[k] for k, v in dense_lora.counts().items()}

    # bf16: the dense expand rounds as the stock CPU op does (product, then sum): bit for bit,
    # in the all-slots form too (another slot's columns add exact zeros).
    tol = 1e-5 if dtype == torch.float32 else 0.0
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
    base_rows = [i for i, lid in enumerate(mapping) if lid == 0]
    assert torch.equal(got[base_rows], base_out[base_rows])  # untouched, bit for bit
    expect = _expected_path(form, name, mapping)
    assert ran[expect] == 1 and sum(ran.values()) == 1, ran  # one module application


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("name", list(MAPPINGS))
def test_row_parallel_calls_match_stock_punica(wrapper_cls, monkeypatch, name, form):
    """o_proj / down_proj / GDN out_proj: one stacked buffer, shrink then expand at an offset,
    through the vidlora::lora_shrink / lora_expand ops."""
    mapping = MAPPINGS[name]
    a, b = _weights(torch.float32, slices=(16,))
    x = torch.randn(len(mapping), 32)
    out = torch.randn(len(mapping), 40)

    stock = _wrapper(wrapper_cls, mapping)
    buf = torch.full((1, len(mapping), 8), 7.0)  # stale values: the shrink must overwrite every row
    type(stock).add_shrink.__vidlora_orig__(stock, buf, x, a, 0.5)
    want = out.clone()
    type(stock).add_expand.__vidlora_orig__(stock, want, buf, b, (16,), offset_start=20, add_inputs=True)

    _form(monkeypatch, form)
    dense = _wrapper(wrapper_cls, mapping)
    buf2 = torch.full((1, len(mapping), 8), 7.0)
    dense.add_shrink(buf2, x, a, 0.5)
    lora_rows = [i for i, lid in enumerate(mapping) if lid != 0]  # stock skips a step without any
    torch.testing.assert_close(buf2[:, lora_rows], buf[:, lora_rows], atol=1e-5, rtol=1e-5)
    assert not buf2[:, [i for i in range(len(mapping)) if i not in lora_rows]].any()  # ours: exact 0
    got = out.clone()
    dense.add_expand(got, buf2, b, (16,), offset_start=20, add_inputs=True)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(got[:, :20], out[:, :20]) and torch.equal(got[:, 36:], out[:, 36:])


def test_a_call_whose_rows_differ_from_the_plan_runs_punica(wrapper_cls):
    """A stale plan (another step's token count, a padded batch) is never applied densely."""
    w = _wrapper(wrapper_cls, [22] * 10)
    assert dense_lora._dense_segments(w, torch.zeros(10, 32)) == ((0, 10, 1),)
    assert dense_lora._dense_segments(w, torch.zeros(12, 32)) is None


# -- the all-slots form: what a CUDA graph captures (issue 35) ------------------------------------
# The CPU captures nothing, so these drive it with VIDLORA_DENSE_LORA_GRAPHS=always, through the
# same wrapper methods the layers call, against the stock wrapper on the same mapping.

def _always(monkeypatch, cls, mapping):
    _form(monkeypatch, "all slots")
    return _wrapper(cls, mapping)


def test_all_slots_form_reads_the_mapping_when_it_runs_not_when_it_was_recorded(wrapper_cls, monkeypatch):
    """What makes it graph-safe: the ops read one-hot rows from buffers the wrapper rewrites in
    place at every mapping (before a replay), so a new mapping changes the result of the same
    recorded call without any Python decision."""
    a, b = _weights(torch.float32, slices=(16,))
    x = torch.randn(6, 32)
    w = _always(monkeypatch, wrapper_cls, [11] * 6)
    pick = dense_lora._pick(w, x, torch.float32, len(SLOTS))
    assert pick.data_ptr() == w._vidlora_picks[torch.float32].data_ptr()

    def recorded_call():
        y = torch.zeros(6, 16)
        dense_lora.all_slots_linear(y, x, a, b, 1.0, (16,), True, pick)
        return y

    as_11 = recorded_call()
    from vllm.lora.layers import LoRAMapping

    w.update_metadata(LoRAMapping(index_mapping=(33,) * 3 + (0,) * 3, prompt_mapping=(33,), is_prefill=True),
                      SLOTS, len(SLOTS), 1000)
    after = recorded_call()  # the same pick tensor, now rows of slot 2 then rows of no adapter
    want = torch.zeros(6, 16)
    want[:3] = x[:3] @ a[0][2, 0].t() @ b[0][2, 0].t()
    torch.testing.assert_close(after, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(as_11, x @ a[0][0, 0].t() @ b[0][0, 0].t(), atol=1e-4, rtol=1e-4)


def test_one_hot_gives_no_adapter_to_negative_and_out_of_range_slots():
    slot = torch.tensor([0, 3, -1, 4, 2])
    assert dense_lora.one_hot(slot, 4, torch.float32).tolist() == [
        [1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 1, 0]]


def test_graph_mode_is_checked_when_the_patch_is_probed(monkeypatch):
    monkeypatch.setenv("VIDLORA_DENSE_LORA_GRAPHS", "sometimes")
    assert "VIDLORA_DENSE_LORA_GRAPHS='sometimes'" in dense_lora.probe()
    monkeypatch.setenv("VIDLORA_DENSE_LORA_GRAPHS", "off")
    assert dense_lora.graph_mode() == "off"


@pytest.mark.parametrize("mode", [None, "on"])
def test_eager_steps_keep_their_path_unless_always(wrapper_cls, monkeypatch, mode):
    """`off` (the default: Punica in graphs) and `on` change only what a CUDA graph captures;
    the CPU never captures."""
    if mode is None:
        monkeypatch.delenv("VIDLORA_DENSE_LORA_GRAPHS", raising=False)
    else:
        monkeypatch.setenv("VIDLORA_DENSE_LORA_GRAPHS", mode)
    w = _wrapper(wrapper_cls, [22] * 10)
    assert w._vidlora_graph_mode == (mode or "off")
    assert dense_lora._pick(w, torch.zeros(10, 32), torch.float32, 4) is None


def test_the_ops_find_their_wrapper_through_the_mapping_buffer_they_are_passed(wrapper_cls):
    """A compiled graph passes tensors at every call but bakes ints in, and torch.compile's cache
    gives an engine rebuilt in the same process the first engine's graph: so the ops are given
    the wrapper's own mapping buffer and reach the wrapper of the engine that runs them."""
    a, _ = _weights(torch.float32, slices=(16,))
    x = torch.randn(4, 32)
    first, second = _wrapper(wrapper_cls, [22] * 4), _wrapper(wrapper_cls, [33] * 4)
    for w, slot in ((first, 1), (second, 2)):
        buf = torch.zeros(1, 4, 8)
        torch.ops.vidlora.lora_shrink(buf, x, list(a), 1.0, w._token_lora_indices)
        torch.testing.assert_close(buf[0], x @ a[0][slot, 0].t(), atol=1e-5, rtol=1e-5)
    with pytest.raises(RuntimeError, match="no live Punica wrapper owns this mapping buffer"):
        torch.ops.vidlora.lora_shrink(torch.zeros(1, 4, 8), x, list(a), 1.0, torch.zeros(4, dtype=torch.long))
