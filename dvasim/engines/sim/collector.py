"""Python's cyclic garbage collector while events run: its young collections spaced out.

CPython collects its youngest generation every 700 net allocations of container objects, and a run allocates a
few on every event (an execution, a SimPy event, a query's stage times) that reference counting frees, or keeps
on purpose. None of them is cyclic garbage (``tests/engines/test_collector.py`` checks that no run drops any while
its events run), so those collections find nothing. While a run's events are processed the youngest generation's
threshold is raised to :data:`YOUNG_THRESHOLD`: the collector still runs, at most that many new objects apart, so a
cycle a custom policy makes is still collected and memory stays bounded; the older generations keep their
thresholds. Measured with issue 25's benchmark (compiled core, records still buffered as tuples then): ZeroBatch
4% and DelayBatch 9% faster, DVABatch unchanged.

The threshold is the interpreter's, so :func:`spaced_collections` counts who is inside: the first run in raises
it and the last one out (however it leaves) puts back what it found. A collector that was switched off
(``gc.disable()``) or given a threshold of its own at least as high is left as it is.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 50_000  # new container objects between two collections of the youngest generation, during a run

_lock = threading.Lock()
_inside = 0
_saved: tuple[int, ...] | None = None  # the thresholds found by the first run in (None: left as they were)


@contextmanager
def spaced_collections(young: int = YOUNG_THRESHOLD) -> Iterator[None]:
    """Collections of the youngest generation at most ``young`` new objects apart while inside (see the module)."""
    global _inside, _saved
    with _lock:
        if _inside == 0:
            found = gc.get_threshold()
            _saved = found if gc.isenabled() and 0 < found[0] < young else None
            if _saved is not None:
                gc.set_threshold(young, *found[1:])
        _inside += 1
    try:
        yield
    finally:
        with _lock:
            _inside -= 1
            if _inside == 0 and _saved is not None:
                gc.set_threshold(*_saved)
                _saved = None
