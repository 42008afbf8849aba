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
    assert not reg.ok and "cannot read the adapter" in reg.reason and str(tmp_path) not in reg.reason
    missing = registry(model, tmp_path, root).register("m", root / "nested" / "gone")
    assert missing.reason == "adapter directory nested/gone does not exist"


def test_clean_reason_drops_paths_and_terminal_codes(tmp_path):
    place = tmp_path / "a"
    text = f"\x1b[31mError\x1b[0m in {place}{os.sep}adapter_model.bin and {place}\x07"
    assert clean_reason(text, place) == "Error in adapter_model.bin and the adapter directory"
