"""Triton's dynamic batcher: ZeroBatch (no batch window) and DelayBatch (a tuned maximum queue delay).

Semantics (Triton's ``dynamic_batching``): requests queue at the front door. Whenever a model instance is free (an
instance of the pipeline, ``[engine] instances``, that holds no batch), the batcher looks at the queue:

1. if ``max_batch_size`` requests are waiting, a batch of ``max_batch_size`` leaves at once;
2. else, if a preferred batch size can be formed, the largest such batch leaves at once;
3. else, if the oldest request has waited ``max_queue_delay_ms``, all waiting requests leave as one batch;
4. else it waits (until the oldest request's delay expires, or until more requests arrive).

With ``max_queue_delay_ms = 0`` (ZeroBatch) step 3 always fires: whatever has queued while the instance was busy
leaves as one batch. The model runs whole: one batch at a time per instance, single entry, single exit.

Triton's batcher whole, with its queue policy and priority levels (policy ``triton``), is
:mod:`dvasim.policies.triton_server`. The dynamic batcher runs on every front-door decision, so it is part of the
optional compiled core (:mod:`dvasim.compiled`); its classes take interpreted subclasses (the peers' batchers,
Triton's whole batcher, users').
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from dvasim.core.compiling import mypyc_attr
from dvasim.core.query import Query
from dvasim.errors import ConfigError
from dvasim.policies.base import (
    FrontDoorPolicy,
    New,
    Stretch,
    check_nonneg_number,
    check_positive_int,
    register,
    time_eps,
)


def note_payloads(instances: Any, taken: list, now: float) -> None:
    """Each query's payload times (:class:`dvasim.core.query.Query`: ``payload_formed``, ``on_instance``) after the
    release's instance pipeline ``instances`` (:class:`dvasim.policies.triton_release.InstancePipeline`) moved at
    ``now``: the batcher forms, grows and hands on payloads only when asked (``step``, ``take``, at the front door),
    so a request found in a queued payload and not yet noted left the batcher's queue now, and one found in a
    payload on an instance's stream, or in ``taken`` (the queries of the payloads an instance took now: the batches
    that started, or the payload a backend of its own took), reached its instance now."""
    for p in instances.queue:
        _note_formed(p.queries, now)
    for stream in instances.streams:
        for p in stream:
            _note_formed(p.queries, now)
            _note_on_instance(p.queries, now)
    for qs in taken:
        _note_formed(qs, now)
        _note_on_instance(qs, now)


# A payload's requests are noted in the order they joined it (it grows at its end; a merge at dequeue appends the
# payloads queued behind it, formed no earlier), so a request already noted has every request ahead of it noted
# too: each walk goes from the end to the first one noted, not over the whole payload at every decision.
def _note_formed(queries: list, now: float) -> None:
    i = len(queries) - 1
    while i >= 0:
        q: Query = queries[i]
        if q.payload_formed == q.payload_formed:  # (not NaN: noted before)
            return
        q.payload_formed = now
        i -= 1


def _note_on_instance(queries: list, now: float) -> None:
    i = len(queries) - 1
    while i >= 0:
        q: Query = queries[i]
        if q.on_instance == q.on_instance:
            return
        q.on_instance = now
        i -= 1


@mypyc_attr(allow_interpreted_subclasses=True)
class TritonDynamicBatcher(FrontDoorPolicy):
    params = {
        "max_batch_size": "largest batch the batcher forms",
        "preferred_batch_size": "batch sizes that leave at once when they can be formed (int or list)",
        "max_queue_delay_ms": "how long the oldest request may wait for a larger batch",
    }
    # (ClassVar: a subclass's own value is read, compiled too; a plain class attribute would become an instance
    # attribute of the compiled class, its default the base's)
    default_delay_ms: ClassVar[float] = 0.0
    # the release's instance pipeline (dvasim.policies.triton_release), made at bind; None: the idealised batcher
    _instances: Any

    def __init__(self, max_batch_size=64, preferred_batch_size=None, max_queue_delay_ms=None):
        super().__init__()
        self._instances = None
        self.max_batch_size = check_positive_int("policy.max_batch_size", max_batch_size)
        if preferred_batch_size is None:
            preferred = []
        elif isinstance(preferred_batch_size, int) and not isinstance(preferred_batch_size, bool):
            preferred = [preferred_batch_size]
        elif isinstance(preferred_batch_size, list):
            preferred = list(preferred_batch_size)
        else:
            raise ConfigError("policy.preferred_batch_size", f"must be an integer or a list of integers, got {preferred_batch_size!r}")
        for p in preferred:
            check_positive_int("policy.preferred_batch_size", p)
            if p > self.max_batch_size:
                raise ConfigError("policy.preferred_batch_size", f"{p} exceeds max_batch_size {self.max_batch_size}")
        self.preferred_batch_size = sorted(set(preferred))
        delay = self.default_delay_ms if max_queue_delay_ms is None else max_queue_delay_ms
        self.max_queue_delay_ms = check_nonneg_number("policy.max_queue_delay_ms", delay)

    def bind(self, view) -> None:
        super().bind(view)
        top = view.profile.max_batch_size
        if self.max_batch_size > top:
            raise ConfigError(
                "policy.max_batch_size", f"{self.max_batch_size} exceeds the table's largest profiled batch size {top}"
            )
        self._bind_release(view)

    def _bind_release(self, view) -> None:
        """The Triton release the run serves on (the pipeline's ``triton_release``, from the serving stack): any
        but ``"ideal"`` runs the release's instance pipeline (:mod:`dvasim.policies.triton_release`)."""
        from dvasim.policies.triton_release import InstancePipeline, release_rules

        rules = release_rules(getattr(view, "triton_release", "ideal"), bool(getattr(view, "eager_batching", False)))
        self._instances = None if rules.ideal else InstancePipeline(rules, self, int(getattr(view, "instances", 1)))

    @property
    def triton_release(self) -> str:
        return "ideal" if self._instances is None else self._instances.rules.name

    def _free(self) -> bool:
        """May a batch be formed now: an instance holds no batch (ideal), or the release's batcher has a payload
        slot (``PayloadSlotAvailable``)."""
        if self._instances is not None:
            return bool(self._instances.slot_free())
        return self.view.free_instances() > 0

    def has_pending(self) -> bool:
        return self.has_requests() or (self._instances is not None and bool(self._instances.holds_work()))

    # ---- what the release's instance pipeline asks its batcher
    def has_requests(self) -> bool:
        return bool(self.pending)

    def pending_count(self) -> int:
        return len(self.pending)

    def _form_size(self, now: float) -> int:
        return self._size_now(now)

    def _take_n(self, n: int) -> list:
        return self.take(n)

    def _preferred_sizes(self) -> list[int]:
        return self.preferred_batch_size or [self.max_batch_size]

    def has_queue_policy(self) -> bool:
        return False

    def _release_ops(self, now: float) -> list[New | Stretch]:
        """The batches that start now under the release's instance pipeline."""
        view = self.view
        busy = set(range(int(getattr(view, "instances", 1)))) - set(view.free_lane_indices())
        started = self._instances.step(now, busy)
        note_payloads(self._instances, [qs for _, qs in started], now)
        return [New(qs, lane=i) for i, qs in started]

    def _size_now(self, now: float) -> int:
        n = len(self.pending)
        if n >= self.max_batch_size:
            return self.max_batch_size
        fitting = [p for p in self.preferred_batch_size if p <= n]
        if fitting:
            return fitting[-1]
        if n and now - self.pending[0].seen >= self.max_queue_delay_ms - time_eps(now):
            return n
        return 0

    def admit(self, now: float) -> list[New | Stretch]:
        if self._instances is not None:
            return self._release_ops(now)
        ops: list[New | Stretch] = []
        while self.pending and len(ops) < self.view.free_instances():
            n = self._size_now(now)
            if n == 0:
                break
            ops.append(New(self.take(n)))
        return ops

    def next_wakeup(self, now: float) -> float:
        if self.pending and self._free():
            return self.pending[0].seen + self.max_queue_delay_ms
        return math.inf


@mypyc_attr(allow_interpreted_subclasses=True)
class ZeroBatch(TritonDynamicBatcher):
    """Triton's dynamic batcher with no batch window (``max_queue_delay_ms = 0``)."""

    name = "zerobatch"

    def __init__(self, max_batch_size=64, preferred_batch_size=None, max_queue_delay_ms=0.0):
        if max_queue_delay_ms not in (0, 0.0):
            raise ConfigError("policy.max_queue_delay_ms", "zerobatch has no batch window; use delaybatch for a delay > 0")
        super().__init__(max_batch_size, preferred_batch_size, 0.0)


@mypyc_attr(allow_interpreted_subclasses=True)
class DelayBatch(TritonDynamicBatcher):
    """Triton's dynamic batcher with a batch window (``max_queue_delay_ms > 0``; default 5 ms)."""

    name = "delaybatch"
    default_delay_ms: ClassVar[float] = 5.0


register(ZeroBatch)  # (after the classes: a compiled class takes no other decorator)
register(DelayBatch)
