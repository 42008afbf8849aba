"""The one adapter path's host-side verdict: links that leave the adapter root are refused (unless
a setting allows them), and reasons never show a server path."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from engine_patch.registration import AdapterRegistry, clean_reason


def registry(model: Path, tmp_path: Path, root: Path | None, **kw) -> AdapterRegistry:
    return AdapterRegistry(model / "base", 16, tmp_path / "prepared", root=root, **kw)


def test_an_adapter_folder_linked_within_the_root_is_served(model, full, tmp_path):
    root = tmp_path / "adapters"
    shutil.copytree(full, root / "v2")
    (root / "current").symlink_to(root / "v2")
    assert registry(model, tmp_path, root).register("a", root / "current").ok


@pytest.mark.parametrize("what", ["folder", "file"])
def test_a_link_outside_the_adapter_root_is_refused_unless_allowed(model, full, tmp_path, what):
    root, outside = tmp_path / "adapters", tmp_path / "private"
    shutil.copytree(full, outside)
    if what == "folder":
        root.mkdir()
        (root / "a").symlink_to(outside)
    else:
        (root / "a").mkdir(parents=True)
        shutil.copy(full / "adapter_config.json", root / "a" / "adapter_config.json")
        (root / "a" / "adapter_model.safetensors").symlink_to(outside / "adapter_model.safetensors")
    reg = registry(model, tmp_path, root).register("a", root / "a")
    assert not reg.ok and "outside the adapter root" in reg.reason
    assert str(tmp_path) not in reg.reason
    if what == "file":
        assert reg.reason.startswith("adapter_model.safetensors is a link")
    assert registry(model, tmp_path, root, links_outside_root=True).register("a", root / "a").ok


def test_reasons_name_files_relative_to_the_adapter(model, full, tmp_path):
    root = tmp_path / "adapters"
    bad = root / "truncated"
    shutil.copytree(full, bad)
    data = (bad / "adapter_model.safetensors").read_bytes()
    (bad / "adapter_model.safetensors").write_bytes(data[: len(data) // 3])
    reg = registry(model, tmp_path, root).register("t", bad)
    assert not reg.ok and str(tmp_path) not in reg.reason
    assert reg.reason.startswith("adapter_model.safetensors cannot be read: SafetensorError: ")
    missing = registry(model, tmp_path, root).register("m", root / "nested" / "gone")
    assert missing.reason == "adapter directory nested/gone does not exist"


def test_clean_reason_drops_paths_and_terminal_codes(tmp_path):
    place = tmp_path / "a"
    text = f"\x1b[31mError\x1b[0m in {place}{os.sep}adapter_model.bin and {place}\x07"
    assert clean_reason(text, place) == "Error in adapter_model.bin and the adapter directory"


def test_an_fp8_base_in_qwens_published_layout_serves_and_refuses_what_the_bf16_base_does(model, full, tmp_path):
    """Qwen's FP8 checkpoints keep the modules' names and shapes (weights in float8 with block
    scales beside them): every adapter gets the verdict, and the prepared adapter the digest,
    it gets on the bf16 base. A DoRA adapter is refused on both, for the same reason."""
    import json

    from safetensors import safe_open

    from tests.support.fp8_checkpoint import write_fp8_checkpoint

    fp8 = write_fp8_checkpoint(model / "base", tmp_path / "fp8" / "base")
    with safe_open(str(fp8 / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert "float8" in str(f.get_tensor("model.language_model.layers.3.mlp.down_proj.weight").dtype)
    assert "model.language_model.layers.3.mlp.down_proj.weight_scale_inv" in keys
    assert "model.language_model.layers.0.linear_attn.in_proj_a.weight_scale_inv" not in keys

    dora = tmp_path / "dora"
    shutil.copytree(full, dora)
    cfg = json.loads((dora / "adapter_config.json").read_text())
    (dora / "adapter_config.json").write_text(json.dumps({**cfg, "use_dora": True}))
    adapters = [full, *sorted(p for p in (model / "adapters").iterdir() if p.is_dir()), dora]
    bf16_reg = AdapterRegistry(model / "base", 16, tmp_path / "prepared-bf16")
    fp8_reg = AdapterRegistry(fp8, 16, tmp_path / "prepared-fp8")
    for a in adapters:
        on_bf16, on_fp8 = bf16_reg.register(a.name, a), fp8_reg.register(a.name, a)
        assert (on_fp8.ok, on_fp8.reason, on_fp8.digest) == (on_bf16.ok, on_bf16.reason, on_bf16.digest), a.name
    assert not fp8_reg.register("dora", dora).ok and "DoRA" in fp8_reg.register("dora", dora).reason
    assert sum(fp8_reg.register(a.name, a).ok for a in adapters) == len(adapters) - 1


@pytest.mark.parametrize("fault", ["under a file", "read-only"])
def test_an_unwritable_cache_is_a_server_fault_judged_again_once_fixed(model, full, tmp_path, fault, caplog):
    """Not the adapter's verdict: stage "server", the log names the folder, nothing is cached,
    and the same adapter is served as soon as the folder can be written."""
    if fault == "read-only" and os.geteuid() == 0:
        pytest.skip("root writes through a read-only mode")
    parent = tmp_path / "var"
    if fault == "under a file":
        parent.write_text("a file")
    else:
        parent.mkdir(mode=0o500)
    reg = AdapterRegistry(model / "base", 16, parent / "prepared")
    src = tmp_path / "a"
    shutil.copytree(full, src)
    with caplog.at_level("ERROR", logger="engine_patch.registration"):
        bad = reg.register("a", src)
    assert not bad.ok and bad.stage == "server" and bad.digest is None
    assert bad.reason.startswith("not judged: a server fault, not the adapter's: the prepared-adapter cache")
    assert str(tmp_path) not in bad.reason and "vidlora doctor" in bad.reason
    assert str(parent / "prepared") in caplog.text and reg.server_fault
    if fault == "under a file":
        parent.unlink()
    else:
        parent.chmod(0o700)
    good = reg.register("a", src)
    assert good.ok and good.stage == "host" and reg.server_fault is None


def test_a_base_model_that_cannot_be_read_is_a_server_fault(full, tmp_path):
    reg = AdapterRegistry(tmp_path / "no-model", 16, tmp_path / "prepared").register("a", full)
    assert not reg.ok and reg.stage == "server" and str(tmp_path) not in reg.reason
    assert reg.reason.startswith("not judged: a server fault, not the adapter's: the base model cannot be read")
