"""The meta operations a policy answers with and the mechanism carries out (paper §5): *new*, *stretch* and
*split*, and the clock tolerance both sides compare times with. Imports nothing but the standard library.

Part of the optional compiled core (:mod:`dvasim.compiled`): the operations write their ``__init__`` out (the one
dataclass generates is interpreted code), and their fields are typed ``Any`` so that a compiled core refuses
nothing the pure one accepts (the pipeline checks what a policy returned and says what is wrong)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final


@dataclass(init=False)
class New:
    """*new*: a batch of ``queries``; ``splittable`` marks a batch that may later be split (never stretched).

    Returned by :meth:`Policy.admit`, it creates a batch that enters the first stage. Returned by
    :meth:`Policy.at_boundary` with exactly the finished batch's queries, it re-creates that batch as a new row
    (a new id, created now, the latest batch) that continues from the next stage (paper Figure 12, line 16).

    ``lane`` (front door only; default ``None``: the pipeline picks an instance) sends the batch to that model
    instance (``[engine] instances``), which must hold no batch: a policy that dispatches to its own workers
    (E2bird's multi-granularity engine, :mod:`dvasim.policies.e2bird`) names the worker."""

    queries: Any  # (a list of queries; Any: a compiled core checks nothing the pure one does not)
    splittable: Any = False
    lane: Any = None
    pad_len: Any = 0

    def __init__(self, queries: Any, splittable: Any = False, lane: Any = None, pad_len: Any = 0) -> None:
        self.queries, self.splittable, self.lane, self.pad_len = queries, splittable, lane, pad_len


@dataclass(init=False)
class Stretch:
    """*stretch*: add ``queries`` to the latest batch ``bid``. ``splittable = True`` marks the stretched batch as
    one that may be split later (its new size passed the policy's split test), which ends its stretching.

    ``merge_stage`` (default None: the batch runs merged after the furthest stage it has been handed to, §5.2.2)
    lets the batch's earlier rows go on alone through the stages up to and including ``merge_stage`` (the stage
    the DVABatch backend has dispatched them into, :mod:`dvasim.policies.dvabatch_built`); the newcomers catch up
    and the batch runs merged from the stage after it."""

    bid: Any
    queries: Any
    splittable: Any = False
    merge_stage: Any = None

    def __init__(self, bid: Any, queries: Any, splittable: Any = False, merge_stage: Any = None) -> None:
        self.bid, self.queries, self.splittable, self.merge_stage = bid, queries, splittable, merge_stage


SPLIT_MANNERS = ("serial", "pipelined", "one-stage")


@dataclass(init=False)
class Split:
    """*split*: split batch ``bid`` (whole after the current stage) into sub-batches of ``sizes``.

    ``manner = "serial"`` (the paper's Figure 2 and Figure 3 Case II): the sub-batches run the remaining stages
    one after another -- the next is handed to the next stage only when the one before it has left the last
    stage -- and the parent's buffer pair is held (no new batch takes it) until the last of them has left.
    ``manner = "pipelined"``: all sub-batches are handed on at once and follow each other stage by stage,
    overlapping as far as the buffer pairs allow (for studies). ``manner = "one-stage"`` (the DVABatch backend's
    OPERATOR_DVA, :mod:`dvasim.policies.dvabatch_built`): the next stage runs the sizes one after another as parts
    of the same batch, which is whole again (re-merged) once the last part completes that stage."""

    bid: Any
    sizes: Any
    manner: Any = "serial"

    def __init__(self, bid: Any, sizes: Any, manner: Any = "serial") -> None:
        self.bid, self.sizes, self.manner = bid, sizes, manner



def time_eps(now: float) -> float:
    """The tolerance of a comparison between simulated times near ``now`` (ms): 1e-9 ms, or 16 units in the last
    place of ``now`` where the clock's float spacing is coarser (from 2**19 ms, about 8.7 simulated minutes), so
    that a deadline computed as ``seen + window`` is met by the clock that reaches it, at any magnitude."""
    if -524288.0 < now < 524288.0:  # below 2**19 ms, 16 ulp are at most 2**-30 < 1e-9 (a fast path, same value)
        return 1e-9
    return max(1e-9, 16.0 * _ULP(now))


_ULP: Final = math.ulp  # (a constant to a compiled core, not looked up in math's module at each call)
