"""Outputs are written whole and never over something that is not a regular file (dvasim/outputs.py): renaming a
finished file onto a device, a pipe or a folder would replace it (as root, /dev/null itself). The tests use a
FIFO and a folder of their own, never /dev/null."""

from __future__ import annotations

import os
import stat

import pytest

from dvasim.errors import OutputError
from dvasim.outputs import atomic_path, write_text, write_whole


def test_a_regular_file_is_replaced_whole(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("old")
    write_text(f, "new")
    assert f.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["a.txt"]


@pytest.mark.parametrize("kind", ["fifo", "folder", "dangling link"])
def test_a_non_regular_target_is_refused_and_left_as_it_was(tmp_path, kind):
    target = tmp_path / "out"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "folder":
        target.mkdir()
    else:
        target.symlink_to(tmp_path / "nowhere")
    with pytest.raises(OutputError, match="not a regular file"):
        write_text(target, "x")
    with pytest.raises(OutputError, match="not a regular file"):
        write_whole({tmp_path / "ok.csv": lambda p: p.write_text("a"), target: lambda p: p.write_text("b")})
    with pytest.raises(OutputError), atomic_path(target) as tmp:
        tmp.write_text("never renamed")
    mode = os.lstat(target).st_mode
    assert {"fifo": stat.S_ISFIFO, "folder": stat.S_ISDIR, "dangling link": stat.S_ISLNK}[kind](mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing else written, no temporary left
