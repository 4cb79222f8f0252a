"""DVABatch's scheduling policies (paper §7.2) on top of the meta operations.

* **Policy I, input diversity.** Pending queries are clustered by input length (sorted by length, cut where the
  padding saved outweighs running one more batch; at most ``max_clusters`` clusters); each cluster is padded to
  its own longest input and enters the pipeline as a batch of its own, so the clusters run in parallel. The batch
  window is the first stage's duration at ``bs_max`` (for the longest pending input), and at most ``bs_max``
  queries are active in the pipeline at once.
* **Policy II, operator diversity.** When a batch of size ``bs`` completes a stage, it is split in two when the
  remaining stages take ``T_remain(bs) >= split_factor * T_remain(bs/2)`` (``split_factor`` = 2 in the paper), and
  the halves are examined again. Batches that such a split may reach are created *splittable* (so never stretched).
* **Policy III, load diversity.** Newly arrived queries stretch the latest batch unless it has already been
  processed (since its first stage started) for longer than ``t_comp_wait_ms`` or is full; otherwise they wait for
  the first stage to take a new batch.

``dvabatch`` picks the policies the latency table's diversities call for, as the paper identifies them offline
(§7.1): *input* when the table has a sequence-length dimension; *operator* when Policy II would split a batch of
``bs_max`` at some stage boundary; *load* always, except together with *input* (new batches entering the pipeline
independently already resolve load diversity, §7.2). ``policies = [...]`` overrides the choice. ``dvabatch-split``
enables only *split* (the paper's Figure 18), behind a Triton-style window.
"""

from __future__ import annotations

import math

from dvasim.errors import ConfigError
from dvasim.policies.base import (
    New,
    Policy,
    Split,
    Stretch,
    check_nonneg_number,
    check_positive_int,
    register,
)

KINDS = ("input", "operator", "load")
EPS = 1e-9


@register
class DVABatch(Policy):
    name = "dvabatch"
    params = {
        "max_batch_size": "bs_max: the largest batch, and the most queries active in the pipeline (Policy I)",
        "policies": 'which diversities to handle: a list of "input", "operator", "load" (default: from the table)',
        "max_queue_delay_ms": "front-door batch window (default: Policy I's first-stage time at bs_max, else 0)",
        "t_comp_wait_ms": "Policy III: a batch processed longer than this is no longer stretched "
        "(default 0: only batches whose first stage has not started)",
        "split_factor": "Policy II: split when T_remain(bs) >= split_factor * T_remain(bs/2) (default 2)",
        "max_clusters": "Policy I: most length clusters formed from one batch of queries (default 3)",
    }
    default_policies: tuple[str, ...] | None = None  # None: decide from the table

    def __init__(self, max_batch_size=64, policies=None, max_queue_delay_ms=None, t_comp_wait_ms=None,
                 split_factor=2.0, max_clusters=3):
        super().__init__()
        self.max_batch_size = check_positive_int("policy.max_batch_size", max_batch_size)
        if policies is None:
            policies = self.default_policies
        if policies is not None:
            if isinstance(policies, str):
                policies = [policies]
            if not isinstance(policies, (list, tuple)) or not all(p in KINDS for p in policies):
                raise ConfigError("policy.policies", f"must be a list of {', '.join(KINDS)}; got {policies!r}")
            policies = tuple(dict.fromkeys(policies))
        self._asked = policies
        self._window = None if max_queue_delay_ms is None else check_nonneg_number(
            "policy.max_queue_delay_ms", max_queue_delay_ms)
        self._t_comp_wait = None if t_comp_wait_ms is None else check_nonneg_number(
            "policy.t_comp_wait_ms", t_comp_wait_ms)
        sf = check_nonneg_number("policy.split_factor", split_factor)
        if sf < 1.0:
            raise ConfigError("policy.split_factor", f"must be >= 1, got {split_factor!r}")
        self.split_factor = sf
        self.max_clusters = check_positive_int("policy.max_clusters", max_clusters)

    # ------------------------------------------------------------------ setup
    def bind(self, view) -> None:
        super().bind(view)
        prof = view.profile
        if self.max_batch_size > prof.max_batch_size:
            raise ConfigError("policy.max_batch_size",
                              f"{self.max_batch_size} exceeds the table's largest profiled batch size {prof.max_batch_size}")
        self.has_len = getattr(prof, "seq_lens", None) is not None
        self.ref_len = int(max(prof.seq_lens)) if self.has_len else None
        if self._asked is not None:
            self.policies = self._asked
            if "input" in self.policies and not self.has_len:
                raise ConfigError("policy.policies", '"input" needs a latency table with a seq_len column')
        else:
            chosen = []
            if self.has_len:
                chosen.append("input")
            if self._would_split(0, self.max_batch_size, self.ref_len):
                chosen.append("operator")
            if not self.has_len:
                chosen.append("load")
            self.policies = tuple(chosen)
        self.use_input = "input" in self.policies
        self.use_split = "operator" in self.policies
        self.use_stretch = "load" in self.policies
        if self._window is not None:
            self.max_queue_delay_ms = self._window
        elif self.use_input:
            self.max_queue_delay_ms = prof.latency(0, self.max_batch_size, self.ref_len)
        else:
            self.max_queue_delay_ms = 0.0
        # The paper gives no value for T_comp_wait. In our simulations (fluid device sharing, two buffer pairs) a
        # stretch of a started batch made its first queries wait for the newcomers' catch-up and never paid
        # (experiments/README.md); so by default only batches that have not started yet are stretched.
        self.t_comp_wait_ms = self._t_comp_wait if self._t_comp_wait is not None else 0.0

    def describe(self) -> dict:
        d = {"name": self.name, "max_batch_size": self.max_batch_size, "split_factor": self.split_factor,
             "max_clusters": self.max_clusters}
        if self.view is not None:
            d.update(policies=list(self.policies), max_queue_delay_ms=self.max_queue_delay_ms,
                     t_comp_wait_ms=self.t_comp_wait_ms)
        return d

    # ------------------------------------------------------------------ Policy II
    def _would_split(self, stage_done: int, bs: int, seq_len) -> bool:
        """Would Policy II split a batch of ``bs`` at some boundary after ``stage_done``?"""
        prof = self.view.profile
        for s in range(stage_done + 1, prof.n_stages):
            if bs >= 2 and prof.remaining(s, bs, seq_len) >= self.split_factor * prof.remaining(s, bs // 2, seq_len) - EPS:
                return True
        return False

    def split_sizes(self, bs: int, from_stage: int, seq_len) -> list[int]:
        """Recursive halving while ``T_remain(bs) >= split_factor * T_remain(bs/2)`` for stages ``from_stage..``."""
        prof = self.view.profile
        if bs < 2 or from_stage >= prof.n_stages:
            return [bs]
        half = bs // 2
        if prof.remaining(from_stage, bs, seq_len) >= self.split_factor * prof.remaining(from_stage, half, seq_len) - EPS:
            return self.split_sizes(bs - half, from_stage, seq_len) + self.split_sizes(half, from_stage, seq_len)
        return [bs]

    def at_boundary(self, batch, stage, now):
        if not (self.use_split and batch.splittable):
            return None
        seq_len = max(q.seq_len for q in batch.queries) if self.has_len else None
        sizes = self.split_sizes(batch.bs, stage + 1, seq_len)
        return Split(batch.bid, sizes) if len(sizes) > 1 else None

    # ------------------------------------------------------------------ Policy I
    def clusters(self, queries: list) -> list[list]:
        """Split queries (any order) into at most ``max_clusters`` groups of similar length, minimising the
        summed query latency of the groups when they run side by side on the device (the fluid sharing model,
        with each group's mean demand over the stages)."""
        prof = self.view.profile
        qs = sorted(queries, key=lambda q: (q.seq_len, q.qid))
        n = len(qs)
        if n <= 1 or self.max_clusters == 1:
            return [qs]
        lens = [q.seq_len for q in qs]
        # candidate cut positions: where the length changes
        cuts = [k for k in range(1, n) if lens[k] != lens[k - 1]]
        best_cost, best = math.inf, [qs]

        def group_cost(parts):
            jobs = [(prof.total(len(g), lens[e - 1]), _mean_demand(prof, len(g), lens[e - 1])) for g, (_, e) in parts]
            return sum(len(g) * t for (g, _), t in zip(parts, fluid_finish_times(jobs)))

        def rec(start, k, acc):
            nonlocal best_cost, best
            # close the last group here
            parts = [*acc, (qs[start:], (start, n))]
            c = group_cost(parts)
            if c < best_cost - EPS:
                best_cost, best = c, [g for g, _ in parts]
            if k + 1 >= self.max_clusters:
                return
            for cut in cuts:
                if cut > start:
                    rec(cut, k + 1, [*acc, (qs[start:cut], (start, cut))])

        rec(0, 0, [])
        return best

    # ------------------------------------------------------------------ front door
    def _room(self) -> int:
        if self.use_input:
            return self.max_batch_size - self.view.active_queries()
        return self.max_batch_size

    def _first_stage_free(self) -> bool:
        return self.view.stage_idle(0)

    def admit(self, now):
        ops = []
        if not self.pending:
            return ops
        if self.use_stretch:
            latest = self.view.table.latest()
            if latest is not None and self.view.table.can_stretch(latest.bid) is None:
                processed = 0.0 if math.isnan(latest.first_start) else now - latest.first_start
                room = self.max_batch_size - latest.bs
                if room > 0 and processed <= self.t_comp_wait_ms:
                    ops.append(Stretch(latest.bid, self.take(room)))
                    if not self.pending:
                        return ops
        room = self._room()
        if room <= 0:
            return ops
        n = len(self.pending)
        free = self._first_stage_free()
        full = n >= min(room, self.max_batch_size)
        expired = now - self.pending[0].seen >= self.max_queue_delay_ms - EPS
        # Policy I: batches enter independently; the window only bounds the wait while the first stage is busy.
        # Otherwise a new batch waits for a free first stage (and, with a window, for the window or a full batch).
        go = (free or full or expired) if self.use_input else (free and (full or expired))
        if not go:
            return ops
        batch = self.take(min(n, room, self.max_batch_size))
        groups = self.clusters(batch) if self.use_input else [batch]
        for g in groups:
            seq_len = max(q.seq_len for q in g) if self.has_len else None
            splittable = self.use_split and self._would_split(0, len(g), seq_len)
            ops.append(New(g, splittable=splittable))
        return ops

    def next_wakeup(self, now):
        if self.pending and self.max_queue_delay_ms > 0 and self._room() > 0:
            t = self.pending[0].seen + self.max_queue_delay_ms
            return t if t > now + EPS else math.inf
        return math.inf


def fluid_finish_times(jobs: list[tuple[float, float]]) -> list[float]:
    """Finish times of jobs ``(standalone_time, demand)`` that all start at 0 and share one device fluidly:
    all run at full speed while their demands sum to at most 1, else each at rate ``1 / sum(demands)``."""
    remaining = [t for t, _ in jobs]
    done = [math.inf] * len(jobs)
    active = set(range(len(jobs)))
    now = 0.0
    while active:
        total = sum(jobs[k][1] for k in active)
        rate = 1.0 if total <= 1.0 + EPS else 1.0 / total
        k_next = min(active, key=lambda k: remaining[k])
        dt = remaining[k_next] / rate
        now += dt
        for k in list(active):
            remaining[k] -= dt * rate
            if remaining[k] <= EPS * max(1.0, jobs[k][0]):
                done[k] = now
                active.discard(k)
    return done


def _mean_demand(prof, bs, seq_len) -> float:
    n = prof.n_stages
    return sum(prof.demand(s, bs, seq_len) for s in range(n)) / n


@register
class DVABatchSplit(DVABatch):
    """DVABatch with only *split* enabled (paper Figure 18), behind a Triton-style batch window."""

    name = "dvabatch-split"
    default_policies = ("operator",)
