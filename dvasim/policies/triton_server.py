"""Triton Inference Server's dynamic batcher whole (policy ``triton``, :class:`TritonServerBatcher`), as a model
configuration sets it (``[policy] triton_config``, :mod:`dvasim.config.triton`): its queue policy
(``max_queue_size``, timeouts that REJECT or DELAY), priority levels, and Triton's own batch rule
(``GetDynamicBatch``), which differs from the rule of ``zerobatch`` and ``delaybatch``
(:mod:`dvasim.policies.triton`) where preferred sizes are given: Triton sends the largest preferred size that fits
even when ``max_batch_size`` requests wait, and once the oldest request's delay is exceeded it sends every waiting
request (up to ``max_batch_size``) rather than a preferred size. Without preferred sizes and a queue policy the two
agree (tested); ``zerobatch`` and ``delaybatch`` keep their rule, which the paper's comparison was made with.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from dvasim.core.arith import int_sum
from dvasim.core.query import Query
from dvasim.errors import ConfigError
from dvasim.policies.base import New, Policy, check_nonneg_number, check_positive_int, register, time_eps
from dvasim.policies.triton import TritonDynamicBatcher

TIMEOUT_ACTIONS = ("REJECT", "DELAY")
QUEUE_POLICY_KEYS = ("max_queue_size", "timeout_action", "default_timeout_ms", "allow_timeout_override")


@dataclass(frozen=True)
class QueuePolicy:
    """Triton's ``ModelQueuePolicy`` of one priority level (its fields' defaults are the proto's: no limit, no
    timeout, REJECT). ``default_timeout_ms`` is ``default_timeout_microseconds`` / 1000."""

    max_queue_size: int = 0
    timeout_action: str = "REJECT"
    default_timeout_ms: float = 0.0
    allow_timeout_override: bool = False

    def describe(self) -> dict:
        return {k: getattr(self, k) for k in QUEUE_POLICY_KEYS}

    @property
    def limited(self) -> bool:
        """It can refuse a query (a queue size limit, or a timeout that rejects)."""
        return self.max_queue_size > 0 or (self.default_timeout_ms > 0 and self.timeout_action == "REJECT")


def queue_policy(field: str, value) -> QueuePolicy:
    """A :class:`QueuePolicy` from a table (``None``: the defaults); one-line errors naming ``field``."""
    if value is None:
        return QueuePolicy()
    if isinstance(value, QueuePolicy):
        return value
    if not isinstance(value, dict):
        raise ConfigError(field, f"must be a table of {', '.join(QUEUE_POLICY_KEYS)}, got {value!r}")
    unknown = sorted(set(value) - set(QUEUE_POLICY_KEYS))
    if unknown:
        raise ConfigError(f"{field}.{unknown[0]}",
                          f"unknown queue policy key; allowed: {', '.join(QUEUE_POLICY_KEYS)}")
    size = check_positive_int(f"{field}.max_queue_size", value.get("max_queue_size", 0), minimum=0)
    action = value.get("timeout_action", "REJECT")
    if action not in TIMEOUT_ACTIONS:
        raise ConfigError(f"{field}.timeout_action", f"must be one of {', '.join(TIMEOUT_ACTIONS)}, got {action!r}")
    timeout = check_nonneg_number(f"{field}.default_timeout_ms", value.get("default_timeout_ms", 0.0))
    override = value.get("allow_timeout_override", False)
    if not isinstance(override, bool):
        raise ConfigError(f"{field}.allow_timeout_override", f"must be true or false, got {override!r}")
    return QueuePolicy(size, action, timeout, override)


class _Level:
    """One priority level's queue: the requests that have not timed out (``queue``, in arrival order) and those
    that timed out under DELAY (``delayed``, behind them; Triton's ``PolicyQueue`` in scheduler_utils.cc)."""

    __slots__ = ("level", "policy", "queue", "delayed")

    def __init__(self, level: int, policy: QueuePolicy):
        self.level, self.policy = level, policy
        self.queue: deque[Query] = deque()
        self.delayed: deque[Query] = deque()

    def size(self) -> int:
        return len(self.queue) + len(self.delayed)

    def deadline(self) -> float:
        """When the oldest request that has not timed out times out (inf: none, or no timeout)."""
        t = self.policy.default_timeout_ms
        return self.queue[0].seen + t if t > 0 and self.queue else math.inf


@register
class TritonServerBatcher(TritonDynamicBatcher):
    """Triton Inference Server's dynamic batcher as a model configuration sets it: preferred batch sizes, the
    queue delay, priority levels and each level's queue policy (max_queue_size, timeouts); what ``[policy]
    triton_config = "config.pbtxt"`` runs (:mod:`dvasim.config.triton`).

    Batches (Triton core ``DynamicBatchScheduler::GetDynamicBatch``, dynamic_batch_scheduler.cc): when an
    instance is free the batcher walks the queued requests in priority order (level 1 first; within a level the
    requests that have not timed out in arrival order, then the delayed ones) up to ``max_batch_size``. If a
    preferred size fits in the walk and the oldest walked request has not waited ``max_queue_delay_ms``, the
    largest such size leaves; else, if the delay is exceeded, or zero, or the walk reached the largest preferred
    size, the whole walk leaves; else it waits. No ``preferred_batch_size`` means ``[max_batch_size]``
    (``NormalizeModelConfig``, model_config_utils.cc). Unlike ``zerobatch`` / ``delaybatch``, a preferred size
    is preferred over ``max_batch_size`` until the delay is exceeded (Triton's user guide, batcher.md: "it will
    create a batch of the largest possible preferred size"). ``dynamic_batching = false`` is Triton's default
    scheduler: every request runs alone, in arrival order, on the next free instance.

    Queues (``PriorityQueue`` / ``PolicyQueue``, scheduler_utils.cc; model_config.proto ``ModelQueuePolicy``):
    one queue per priority level (one in all with ``priority_levels = 0``), each with its own policy
    (``priority_queue_policy``, else ``default_queue_policy``, each field defaulting to the proto's default).
    A request arriving at a level whose queue holds ``max_queue_size`` requests is rejected at once (status
    ``"rejected"``). One still queued ``default_timeout_ms`` after it arrived times out: with REJECT it leaves
    (status ``"timed_out"``), with DELAY it stays, behind every request of its level that has not timed out (so
    ahead of lower levels). A request's priority is its ``priority`` (0, or one above ``priority_levels``: the
    ``default_priority_level``; ``InferenceRequest::SetPriority``).

    Where this differs from Triton, on purpose: Triton notices a timeout lazily, when its batcher thread walks
    the queue (an instance became free, a request arrived) or every 500 ms while all instances are busy
    (``WaitForPayloadSlotAvailable``), and a request past its timeout keeps its place in ``max_queue_size``
    until then; here it times out at its deadline exactly (so a rejection is answered up to 500 ms earlier than
    Triton would, and its slot frees at once). Both never put a timed-out request in a batch under REJECT.
    ``allow_timeout_override`` has no effect: simulated requests carry no timeout of their own. Under the
    ``"ideal"`` release the batcher does not prefetch a batch for a busy instance; under ``"21.10"`` and
    ``"current"`` (``[server] triton_release``, or the stack's) it runs the release's instance pipeline
    (:mod:`dvasim.policies.triton_release`): payloads formed ahead, frozen or growing, merged at dequeue, an
    instance freed when its batch's inputs are consumed.
    """

    name = "triton"
    params = {
        "max_batch_size": "largest batch the batcher forms (Triton: max(1, the model's max_batch_size))",
        "preferred_batch_size": "batch sizes preferred by the batcher (int or list; default [max_batch_size])",
        "max_queue_delay_ms": "how long the oldest request of a batch may wait for a larger one "
                              "(max_queue_delay_microseconds / 1000)",
        "dynamic_batching": "false: Triton's default scheduler, every request alone (no dynamic_batching)",
        "max_queue_size": "default queue policy: most requests a level's queue holds (0: no limit)",
        "timeout_action": 'default queue policy: "REJECT" or "DELAY" a request that timed out',
        "default_timeout_ms": "default queue policy: a request's timeout in the queue (0: none)",
        "allow_timeout_override": "default queue policy: accepted, no effect (requests carry no timeout)",
        "priority_levels": "number of priority levels (0: one queue); level 1 is the highest",
        "default_priority_level": "the level of a request without a priority (1..priority_levels)",
        "priority_queue_policy": "per level, its own queue policy: {1 = {max_queue_size = 4, ...}}",
        "triton_config": "the Triton model configuration these were read from (set by [policy] triton_config)",
    }

    def __init__(self, max_batch_size=64, preferred_batch_size=None, max_queue_delay_ms=0.0,
                 dynamic_batching=True, max_queue_size=0, timeout_action="REJECT", default_timeout_ms=0.0,
                 allow_timeout_override=False, priority_levels=0, default_priority_level=0,
                 priority_queue_policy=None, triton_config=None):
        super().__init__(max_batch_size, preferred_batch_size, max_queue_delay_ms)
        if not isinstance(dynamic_batching, bool):
            raise ConfigError("policy.dynamic_batching", f"must be true or false, got {dynamic_batching!r}")
        self.dynamic_batching = dynamic_batching
        default = queue_policy("policy", {"max_queue_size": max_queue_size, "timeout_action": timeout_action,
                                          "default_timeout_ms": default_timeout_ms,
                                          "allow_timeout_override": allow_timeout_override})
        for k, v in default.describe().items():
            setattr(self, k, v)
        self.priority_levels = check_positive_int("policy.priority_levels", priority_levels, minimum=0)
        self.default_priority_level, per_level = self._check_levels(default_priority_level, priority_queue_policy)
        self.priority_queue_policy = {lv: p.describe() for lv, p in per_level.items()} or None
        if triton_config is not None and not isinstance(triton_config, str):
            raise ConfigError("policy.triton_config", f"must be a path string, got {triton_config!r}")
        self.triton_config = triton_config
        if not dynamic_batching and (default.limited or default.default_timeout_ms or self.priority_levels):
            raise ConfigError("policy.dynamic_batching", "queue policies and priority levels are the dynamic "
                                                         "batcher's; set dynamic_batching = true or remove them")
        # what the batcher runs: Triton's default scheduler sends every request alone
        self._mbs = self.max_batch_size if dynamic_batching else 1
        self._preferred = (self.preferred_batch_size or [self._mbs]) if dynamic_batching else [1]
        # one queue per level, made when a request first comes to it (Triton makes them lazily too: a model may
        # declare up to 2**64 - 1 levels), walked from level 1 (``_order``); level 0 alone without levels
        self._default, self._per_level = default, per_level
        self._levels: dict[int, _Level] = {}
        self._order: list[_Level] = []
        policies = [default, *per_level.values()]
        self._timeouts = any(p.default_timeout_ms > 0 for p in policies)
        self.refuses = any(p.limited for p in policies)  # some level may refuse a request

    def _check_levels(self, default_level, per_level) -> tuple[int, dict[int, QueuePolicy]]:
        """``default_priority_level`` and ``priority_queue_policy`` checked as Triton's ValidateModelConfig does."""
        n = self.priority_levels
        default_level = check_positive_int("policy.default_priority_level", default_level, minimum=0)
        if n and not 1 <= default_level <= n:
            raise ConfigError("policy.default_priority_level", f"must be in 1..{n} with priority_levels = {n}, "
                                                               f"got {default_level}")
        if per_level is None:
            return default_level, {}
        if not isinstance(per_level, dict):
            raise ConfigError("policy.priority_queue_policy", f"must be a table of level = {{queue policy}}, got "
                                                              f"{per_level!r}")
        out = {}
        for key, value in per_level.items():
            level = int(key) if isinstance(key, str) and key.isdigit() else key
            if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= n:
                raise ConfigError(f"policy.priority_queue_policy.{key}", f"a priority level must be in 1..{n} "
                                                                         f"(priority_levels = {n})")
            out[level] = queue_policy(f"policy.priority_queue_policy.{level}", value)
        return default_level, dict(sorted(out.items()))

    def bind(self, view) -> None:
        if not self.dynamic_batching:  # every request runs alone: the table needs only batch size 1
            Policy.bind(self, view)
            self._bind_release(view)
            return
        try:
            super().bind(view)
        except ConfigError as e:  # a Triton config's max_batch_size beyond the table: say where it came from
            if self.triton_config is None:
                raise
            raise ConfigError(e.field, f"{e.message} (max_batch_size of {self.triton_config})") from None

    def describe(self) -> dict:
        out = super().describe()
        if self.triton_config is None:
            out.pop("triton_config", None)
        return out

    @property
    def pending(self) -> list[Query]:
        """Every queued request, in the order the batcher walks them."""
        return [q for lv in self._order for q in (*lv.queue, *lv.delayed)]

    @pending.setter
    def pending(self, _value) -> None:  # the base class's one queue: this batcher keeps one per level
        pass

    def has_requests(self) -> bool:
        return any(lv.queue or lv.delayed for lv in self._order)

    def pending_count(self) -> int:
        return int_sum(lv.size() for lv in self._order)

    def _form_size(self, now: float) -> int:
        return self._batch_size(now)

    def _take_n(self, n: int) -> list:
        return self._take(n)

    def _preferred_sizes(self) -> list[int]:
        return self._preferred

    def has_queue_policy(self) -> bool:
        return self.refuses or self._timeouts or self.priority_levels > 0

    # ---- the front door
    def on_arrival(self, query: Query) -> None:
        lv = self._level_of(query.priority)
        size = lv.policy.max_queue_size
        if size and lv.size() >= size:
            self.view.leave_unserved([query], "rejected")
            return
        lv.queue.append(query)

    def _level_of(self, priority: int) -> _Level:
        n = self.priority_levels
        level = 0 if not n else priority if 1 <= priority <= n else self.default_priority_level
        lv = self._levels.get(level)
        if lv is None:
            lv = self._levels[level] = _Level(level, self._per_level.get(level, self._default))
            self._order = sorted(self._levels.values(), key=lambda x: x.level)
        return lv

    def admit(self, now: float):
        if self._timeouts:
            self._expire(now - time_eps(now))  # any deadline passed unnoticed (an engine that steps late)
        if self._instances is not None:
            ops = self._release_ops(now)
        else:
            ops = []
            free = self.view.free_instances()
            while len(ops) < free:
                n = self._batch_size(now)
                if n == 0:
                    break
                ops.append(New(self._take(n)))
        if self._timeouts:
            self._expire(now + time_eps(now))  # still queued at its deadline: timed out
        return ops

    def _walk(self) -> tuple[int, float]:
        """How many requests the batcher's walk takes (at most max_batch_size) and the oldest one's arrival."""
        left, oldest = self._mbs, math.inf
        for lv in self._order:
            for dq in (lv.queue, lv.delayed):
                if left == 0:
                    return self._mbs, oldest
                if dq:
                    oldest = min(oldest, dq[0].seen)
                    left -= min(left, len(dq))
        return self._mbs - left, oldest

    def _batch_size(self, now: float) -> int:
        """GetDynamicBatch's decision: the batch that leaves now (0: wait)."""
        m, oldest = self._walk()
        if m == 0:
            return 0
        delay = self.max_queue_delay_ms
        exceeded = delay > 0 and now - oldest >= delay - time_eps(now)
        fitting = [p for p in self._preferred if p <= m]
        if fitting and not exceeded:
            return fitting[-1]
        if exceeded or delay == 0 or m >= self._preferred[-1]:
            return m
        return 0

    def _take(self, n: int) -> list[Query]:
        out: list[Query] = []
        for lv in self._order:
            for dq in (lv.queue, lv.delayed):
                while dq and len(out) < n:
                    out.append(dq.popleft())
        return out

    def _expire(self, t: float) -> None:
        """Requests whose deadline is at or before ``t``: rejected (REJECT) or moved behind their level (DELAY)."""
        timed_out = []
        for lv in self._order:
            while lv.deadline() <= t:
                q = lv.queue.popleft()
                if lv.policy.timeout_action == "DELAY":
                    lv.delayed.append(q)
                else:
                    timed_out.append(q)
        self.view.leave_unserved(timed_out, "timed_out")

    def next_wakeup(self, now: float) -> float:
        t = min((lv.deadline() for lv in self._order), default=math.inf) if self._timeouts else math.inf
        if self.max_queue_delay_ms > 0 and self._free():
            m, oldest = self._walk()
            if m:
                t = min(t, oldest + self.max_queue_delay_ms)
        if self._instances is not None:  # r24.10: the batcher's own deadline while it waits for a payload slot
            t = min(t, self._instances.slot_deadline(now))
        return t
