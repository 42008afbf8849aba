"""expand_paths: files, folders (sorted, recursive, confined), archives."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vidlora.config import Settings
from vidlora.ingest.sources import SourceItem, expand_paths


def _tree(root: Path) -> None:
    (root / "b_dir" / "deep").mkdir(parents=True)
    (root / "a_dir").mkdir()
    (root / "z.mp4").write_bytes(b"z")
    (root / "A.MKV").write_bytes(b"a")
    (root / "notes.txt").write_text("n")
    (root / "pack.tar.gz").write_bytes(b"not checked here")
    (root / "a_dir" / "one.mov").write_bytes(b"1")
    (root / "b_dir" / "two.webm").write_bytes(b"2")
    (root / "b_dir" / "deep" / "three.mp4").write_bytes(b"3")
    (root / ".hidden").mkdir()
    (root / ".hidden" / "secret.mp4").write_bytes(b"s")
    os.mkfifo(root / "pipe.mp4")


def test_folder_walk_is_sorted_recursive_and_classified(tmp_path: Path, settings: Settings) -> None:
    root = tmp_path / "batch"
    root.mkdir()
    _tree(root)
    items = list(expand_paths([root], settings))
    by_name = {i.name: i for i in items}
    assert [i.name for i in items] == [
        "batch/.hidden", "batch/A.MKV", "batch/notes.txt", "batch/pack.tar.gz", "batch/pipe.mp4",
        "batch/z.mp4", "batch/a_dir/one.mov", "batch/b_dir/two.webm",
        "batch/b_dir/deep/three.mp4",
    ]
    assert [i.name for i in items if i.kind == "video"] == [
        "batch/A.MKV", "batch/z.mp4", "batch/a_dir/one.mov", "batch/b_dir/two.webm",
        "batch/b_dir/deep/three.mp4"]
    assert by_name["batch/pack.tar.gz"].kind == "archive"
    assert by_name["batch/notes.txt"] == SourceItem(
        "batch/notes.txt", root / "notes.txt", "other",
        "not_video: a .txt file is not a video or an archive of videos")
    assert by_name["batch/pipe.mp4"].kind == "other"
    assert (by_name["batch/pipe.mp4"].reason or "").startswith("special_file")
    assert (by_name["batch/.hidden"].reason or "").startswith("hidden")
    assert by_name["batch/b_dir/deep/three.mp4"].path == root / "b_dir" / "deep" / "three.mp4"


def test_symlinks_do_not_lead_out_of_the_tree(tmp_path: Path, settings: Settings) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "private.mp4").write_bytes(b"p")
    root = tmp_path / "batch"
    (root / "sub").mkdir(parents=True)
    (root / "real.mp4").write_bytes(b"r")
    (root / "escape.mp4").symlink_to(outside / "private.mp4")
    (root / "escape_dir").symlink_to(outside, target_is_directory=True)
    (root / "loop").symlink_to(root, target_is_directory=True)
    (root / "sub" / "inside.mp4").symlink_to(root / "real.mp4")
    (root / "dangling.mp4").symlink_to(tmp_path / "nothing")
    items = {i.name: i for i in expand_paths([root], settings)}
    assert items["batch/real.mp4"].kind == "video"
    assert items["batch/sub/inside.mp4"].kind == "video"  # a link that stays inside is fine
    for name in ("batch/escape.mp4", "batch/escape_dir", "batch/dangling.mp4"):
        assert items[name].kind == "other" and (items[name].reason or "").startswith("symlink"), name
    assert items["batch/loop"].kind == "other"
    assert not any("private" in n for n in items)


def test_plain_files_and_order(tmp_path: Path, settings: Settings) -> None:
    a, b, c = tmp_path / "b.mp4", tmp_path / "a.zip", tmp_path / "x.bin"
    for p in (a, b, c):
        p.write_bytes(b"x")
    items = list(expand_paths([a, b, c], settings))
    assert [(i.name, i.kind) for i in items] == [("b.mp4", "video"), ("a.zip", "archive"),
                                                 ("x.bin", "other")]


def test_missing_path_fails_before_anything_is_yielded(tmp_path: Path, settings: Settings) -> None:
    ok = tmp_path / "ok.mp4"
    ok.write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match="missing.mp4"):
        expand_paths([ok, tmp_path / "missing.mp4"], settings)


def test_custom_video_extensions(tmp_path: Path, make_settings) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "clip.MP4"
    p.write_bytes(b"x")
    settings = make_settings(video_extensions=(".mkv",))
    assert [i.kind for i in expand_paths([p], settings)] == ["other"]
