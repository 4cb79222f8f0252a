"""Sums with the same rounding on every Python version: the simulation's clock path adds with these, never with
``sum()``.

Python 3.12 made the builtin ``sum()`` of floats compensated (Neumaier summation), so from 3.12 on it rounds
differently from 3.10 and 3.11 and a run's simulated times would depend on the interpreter. :func:`left_sum`
adds left to right in plain double arithmetic, ``((x0 + x1) + x2) + ...``: exactly what ``sum()`` did up to 3.11
(its float loop was ``f_result += x``), so results on 3.11 are unchanged, and the same on every version.

``sum()`` starts from the int 0 and :func:`left_sum` from 0.0; ``0 + x`` and ``0.0 + x`` are the same float for
every float ``x`` (-0.0 included: both give 0.0), so the two agree term by term. Only an empty input differs in
type: ``sum([])`` is the int 0, ``left_sum([])`` the float 0.0.

:func:`int_sum` adds counts: integers only (``operator.index``: a float is refused with ``TypeError``), exact on
every version. ``tests/test_version_independence.py`` checks that the clock path's modules add only with these.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any


def left_sum(xs: Iterable[Any]) -> float:  # (terms Any: compiled, numpy's numbers are added as the pure core adds them)
    """``x0 + x1 + ... + xn`` added left to right in plain double arithmetic (0.0 for no terms): the rounding
    ``sum()`` had up to Python 3.11, on every Python version. ``left_sum([1e16, 1.0, -1e16]) == 0.0`` (3.12's
    compensated ``sum()`` gives 1.0)."""
    total = 0.0
    for x in xs:
        total += x
    return total


def int_sum(xs: Iterable[Any]) -> int:  # (terms Any: compiled, numpy's integers reach operator.index)
    """The exact sum of integers (counts, sizes); any non-integer term raises ``TypeError``."""
    total = 0
    index = operator.index
    for x in xs:
        total += index(x)
    return total
