"""Where the watch writes (core/watch/files.py) and how many evidence folders it keeps."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from areal_console.core.watch.evidence import evidence_folders, folder_name, prune
from areal_console.core.watch.files import (
    NotPrivate,
    new_private_dir,
    private_root,
    write_private,
)


def test_folders_and_files_are_private_even_under_a_loose_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        root = private_root(tmp_path / "a" / "evidence")
        folder = new_private_dir(root, "20260101-000000-job")
        path = write_private(folder, "report.md", b"text")
    finally:
        os.umask(old)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_bytes() == b"text"
    with pytest.raises(FileExistsError):
        new_private_dir(root, "20260101-000000-job")
    assert sorted(p.name for p in folder.iterdir()) == ["report.md"]  # no temp file left


def test_no_link_is_written_through(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(NotPrivate, match="symbolic link"):
        private_root(tmp_path / "link")
    root = private_root(tmp_path / "root")
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    (root / "state.json").symlink_to(outside)
    write_private(root, "state.json", b"{}")  # replaces the link, never writes through it
    assert outside.read_text() == "keep" and not (root / "state.json").is_symlink()
    with pytest.raises(ValueError):
        write_private(root, "../x", b"")


def test_keep_removes_the_oldest_evidence_and_only_evidence(tmp_path: Path) -> None:
    root = private_root(tmp_path / "ev")
    names = [folder_name("localhost:29500", 1_700_000_000 + 60 * i) for i in range(5)]
    for name in names:
        write_private(new_private_dir(root, name), "report.md", b"x")
    (root / "notes").mkdir()  # not evidence: never removed
    (tmp_path / "other").mkdir()
    (root / "20000101-000000-link").symlink_to(tmp_path / "other")
    removed = prune(root, 2)
    assert [p.name for p in removed] == names[:3]
    assert [p.name for p in evidence_folders(root)] == names[3:]
    assert (root / "notes").is_dir() and (tmp_path / "other").is_dir()
    assert names[0] == "20231114-221320-localhost_29500"
    assert folder_name("../../x/y", 0).startswith("19700101-000000-") and "/" not in folder_name(
        "../../x/y", 0
    )
