"""Writing result files so that nothing is left half-written, and a full disk is one line.

Every output goes to a temporary name beside its final one (``.NAME.partial``) and is renamed when complete
(:func:`atomic_path`, :func:`write_text`): a reader sees the old file or the new one, never a torn one. An
``OSError`` while writing (a full disk, a read-only folder, a quota) becomes an :class:`~dvasim.errors.OutputError`
naming the file and the fix; the temporary file is removed.

Foundation: may import only the standard library and :mod:`dvasim.errors`.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

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
    p = Path(path)
    return p.with_name(f".{p.name}.partial")


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is renamed to ``path``, on any error it is removed
    (an ``OSError`` is raised again as an :class:`OutputError`)."""
    final = Path(path)
    tmp = partial_path(final)
    try:
        yield tmp
        os.replace(tmp, final)
    except OSError as e:
        _remove(tmp)
        raise output_error(final, e) from None
    except BaseException:
        _remove(tmp)
        raise


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (UTF-8)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def _remove(p: Path) -> None:
    with contextlib.suppress(OSError):
        p.unlink()
