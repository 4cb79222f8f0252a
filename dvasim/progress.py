"""Progress bars only where a person watches: a bar is drawn when stderr is a terminal, and never into a log file
or a pipe (``make run > log`` stays clean). Foundation: may import only the standard library (and tqdm, lazily)."""

from __future__ import annotations

import sys
from typing import Any


class NoBar:
    """What a bar is when none is drawn: every call does nothing."""

    n = 0

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, *args: Any, **kwargs: Any) -> None:
        pass

    def set_description(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> NoBar:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def on_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


def progress_bar(total: int | None = None, *, enabled: bool = True, **kwargs: Any):
    """A tqdm bar (``kwargs`` are tqdm's) when ``enabled`` and stderr is a terminal, else a :class:`NoBar`."""
    if not enabled or not on_terminal():
        return NoBar()
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover  (tqdm is a dependency; a bar is not worth failing for)
        return NoBar()
    return tqdm(total=total, **kwargs)
