"""Writing result files so that nothing is left half-written, and a full disk is one line.

Every output goes to a temporary name of its own beside its final one (``.STEM.<random>.partial.SUFFIX``: two
writers of one path never share it) and is renamed when complete (:func:`atomic_path`, :func:`write_text`,
:func:`write_whole` for files that belong together): a reader sees the old file or the new one, never a torn one. An
``OSError`` while writing (a full disk, a read-only folder, a quota) becomes an :class:`~dvasim.errors.OutputError`
naming the file and the fix; the temporary file is removed.

Foundation: may import only the standard library and :mod:`dvasim.errors`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dvasim.errors import OutputError

_FIX = {
    errno.ENOSPC: "no space left on the device; free some space or give another --out",
    errno.EDQUOT: "disk quota exceeded; free some space or give another --out",
    errno.EROFS: "the file system is read-only; give another --out",
    errno.EACCES: "permission denied; give a folder you can write to",
    errno.EPERM: "permission denied; give a folder you can write to",
}


def output_error(path: str | Path, e: OSError) -> OutputError:
    """The one-line error for an ``OSError`` raised while writing ``path``."""
    fix = _FIX.get(e.errno, f"{e.strerror or e}; check the folder and try again")
    return OutputError(str(path), f"cannot write: {fix}")


def partial_path(path: str | Path) -> Path:
    """The one temporary name of a file that a single writer grows over a run (a streamed record file)."""
    p = Path(path)
    return p.with_name(f".{p.name}.partial")


def temporary_path(path: str | Path) -> Path:
    """A temporary name of its own beside ``path`` (no other writer of ``path`` gets the same one), ending in the
    same suffix, so that a writer that tells the format from the name (a figure) writes the right one."""
    p = Path(path)
    return p.with_name(f".{p.stem}.{uuid.uuid4().hex[:12]}.partial{p.suffix}")


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is renamed to ``path``, on any error it is removed
    (an ``OSError`` is raised again as an :class:`OutputError`)."""
    final = Path(path)
    check_replaceable(final)
    tmp = temporary_path(final)
    try:
        yield tmp
        os.replace(tmp, final)
    except OSError as e:
        _remove(tmp)
        raise output_error(final, e) from None
    except BaseException:
        _remove(tmp)
        raise


def check_replaceable(path: Path) -> None:
    """Refuse to write over anything but a regular file (a device such as /dev/null, a folder, a pipe): renaming a
    finished file onto it would replace it, and a run as root would delete /dev/null."""
    if (path.exists() or path.is_symlink()) and not path.is_file():
        raise OutputError(str(path), "exists and is not a regular file; give the path of a file to (over)write")


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (UTF-8)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_whole(writers: dict[Path, Callable[[Path], Any]]) -> None:
    """Write files that belong together (a results table as CSV and Parquet): ``writer(tmp)`` writes each to a
    temporary name of its own, and only when every writer is done are they all renamed onto their paths; on any
    error none is renamed and the temporary files are removed."""
    tmps: dict[Path, Path] = {}
    path = next(iter(writers))
    for p in writers:
        check_replaceable(Path(p))
    try:
        for path, writer in writers.items():
            tmps[path] = temporary_path(path)
            writer(tmps[path])
        for path, tmp in tmps.items():
            os.replace(tmp, path)
    except BaseException as e:
        for tmp in tmps.values():
            _remove(tmp)
        if isinstance(e, OSError):
            raise output_error(path, e) from None
        if isinstance(e, OutputError) and path in tmps and e.field == str(tmps[path]):  # a writer's own atomic file
            raise OutputError(str(path), e.message) from None
        raise


def _remove(p: Path) -> None:
    with contextlib.suppress(OSError):
        p.unlink()
