"""Turn user-given paths (files, folders, archives) into a flat, ordered list of items.

Folders are walked recursively in sorted order. Inside a walked folder nothing leads out of
it: symlinked directories are never descended, and a symlinked file is used only when its
target resolves inside the folder; everything else is reported as kind "other" with a reason,
so the caller can record it as skipped. Paths given explicitly are taken as the user meant
them (a symlink given on the command line is followed).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from vidlora.config import Settings
from vidlora.ingest.kinds import Kind, kind_of, not_video_reason


@dataclass(frozen=True)
class SourceItem:
    name: str  # display name, relative ("holiday/day1/clip.mp4"; a plain file: its name)
    path: Path
    kind: Kind
    reason: str | None = None  # why an "other" item is not used (None for video/archive)


def _kind_for_file(path: Path, video_exts: tuple[str, ...]) -> tuple[Kind, str | None]:
    kind = kind_of(path.name, video_exts)
    return kind, (not_video_reason(path.name) if kind == Kind.OTHER else None)


def _walk(root: Path, top_name: str, video_exts: tuple[str, ...]) -> Iterator[SourceItem]:
    real_root = root.resolve()
    # Explicit stack of (directory, display prefix); entries sorted by name for a stable order.
    stack: list[tuple[Path, str]] = [(root, top_name)]
    while stack:
        directory, prefix = stack.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as exc:
            yield SourceItem(prefix, directory, Kind.OTHER, f"unreadable: {exc.strerror or exc}")
            continue
        subdirs: list[tuple[Path, str]] = []
        for entry in entries:
            name = f"{prefix}/{entry.name}"
            path = Path(entry.path)
            if entry.name.startswith("."):
                yield SourceItem(name, path, Kind.OTHER, "hidden: dotfile or dot-directory")
                continue
            try:
                if entry.is_symlink():
                    target = path.resolve()
                    if not target.is_relative_to(real_root):
                        yield SourceItem(name, path, Kind.OTHER, "symlink: points outside the folder")
                        continue
                    if target.is_dir():
                        yield SourceItem(name, path, Kind.OTHER, "symlink: directory links not followed")
                        continue
                    if not target.is_file():
                        yield SourceItem(name, path, Kind.OTHER, "special_file: not a regular file")
                        continue
                    yield SourceItem(name, path, *_kind_for_file(path, video_exts))
                    continue
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError as exc:
                yield SourceItem(name, path, Kind.OTHER, f"unreadable: {exc.strerror or exc}")
                continue
            if stat.S_ISDIR(mode):
                subdirs.append((path, name))
            elif stat.S_ISREG(mode):
                yield SourceItem(name, path, *_kind_for_file(path, video_exts))
            else:
                yield SourceItem(name, path, Kind.OTHER, "special_file: not a regular file")
        # Reversed so that popping visits sub-directories in sorted order, depth first.
        stack.extend(reversed(subdirs))


def expand_paths(paths: list[Path], settings: Settings) -> Iterator[SourceItem]:
    """Expand files and folders into items, in the order given (folders sorted, depth first).

    Raises ``FileNotFoundError`` at once (before anything is yielded) if a path is missing.
    """
    paths = [Path(p) for p in paths]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise FileNotFoundError(f"no such file or directory: {', '.join(missing)}")
    return _expand(paths, tuple(settings.video_extensions))


def _expand(paths: list[Path], video_exts: tuple[str, ...]) -> Iterator[SourceItem]:
    for path in paths:
        if path.is_dir():
            top = path.resolve().name or str(path)
            yield from _walk(path, top, video_exts)
        elif path.is_file():
            yield SourceItem(path.name, path, *_kind_for_file(path, video_exts))
        else:
            yield SourceItem(path.name, path, Kind.OTHER, "special_file: not a regular file")
