"""E2bird's elastic batch scheduler (Cui et al., "E2bird: Enhanced Elastic Batch for Improving Responsiveness and
Throughput of Deep Learning Services", TPDS'21): N-Ebird (Algorithm 1) and E-Ebird (Algorithm 2) on the
multi-granularity inference engine.

The engine (paper §6): a set of *workers*, each a model instance of its own (``[engine] instances``, one lane of
the pipeline, which the pipeline creates from the policy: leave ``[engine] instances`` at 1) that runs the whole
model on one batch of exactly its batch size at a time, all of them concurrently on the one device (the device's
sharing model, ``[engine] sharing``). The policy names the worker of every batch it forms (``New(..., lane=k)``)
and sees which workers are idle (``free_lane_indices()``). A worker only ever runs batches of its own size, which the
policy tells the engine (``lane_batch_sizes(k)``: the replay captures CUDA graphs for that size alone per worker).

The memory pool (paper §5) is the engine's ``[engine.transfer] mode = "pool"`` (:mod:`dvasim.server.transfer`): the
policy sees a query (it is *ready*, counted in ``N``) only once its input has been copied to the GPU. Without it
the policies still run (inputs are then ready on arrival).

N-Ebird (``n-ebird``, paper §7.2, Algorithm 1). Whenever something changes (an input becomes ready, a worker
finishes), with ``N`` ready inputs, ``CurInf`` inferences alive (in the engine) and the idle queue ``Q`` (idle
workers sorted by batch size, largest first; ties by worker index): ``R = min(N, MaxInf - CurInf)``; walk ``Q``
from its front and give every worker whose batch size is ``<= R`` the next ``batchsize`` ready inputs in arrival
order (``DevPtr``), ``R -= batchsize``, until ``R <= 0`` or ``Q`` is exhausted. A worker only ever runs a full batch
of its own size. Parameters:

* ``workers`` -- the workers' batch sizes (default the paper's ``[1, 1, 2, 4, 8, 16]``, §7.2.1); one of them must
  be 1, so that any number of ready inputs can run (else the last few inputs of a load would wait forever);
* ``max_inf`` -- MaxInf, the most inferences alive at once (Table 3). The paper takes it as the largest batch
  size that does not violate the QoS target, profiled offline (§7.2), without giving the rule. **Ours**: the
  largest batch size ``b`` profiled in the table whose whole-model time satisfies ``2 T(b) <= qos.target_ms``
  (a query may wait for one batch of ``b`` and then run in one), at least the smallest worker. On the paper's own
  Table 1 this rule gives 32 for ResNet-152 (2 x 93.7 ms <= 200 ms < 2 x T(64)), the paper's ``s = 32``. Without a
  QoS target: the sum of the workers' sizes (no limit beyond the engine's own).

E-Ebird (``e-ebird``, paper §7.3, Algorithm 2). Offline phase: for every ``TotalBS`` in ``total_bs`` (default
``(4, 8, 16, 32)``, §7.3.2) every combination ``[i, j, k, l, m, n]`` of workers of sizes ``1, 2, 4, 8, 16, 32``
with ``TotalBS = i + 2j + 4k + 8l + 16m + 32n`` (Equation 6) is "profiled": all its workers start together, each on
one batch of its size through the whole model, by the co-run profiler of the engine that runs the policy (a
:class:`CoRunProfiler`, handed to the policy by the pipeline; see "The offline profile" below), and the combination
with the lowest *average* latency of its workers (the paper's measure, §7.3.1) is kept (ties: fewer workers, then
larger ones). The engine is built to satisfy every kept configuration (per batch size, the most workers any kept
configuration uses) plus one worker of size 1 and one of size 2 kept by default for the lowest load (§7.3.2).
Online: ``MemState`` is the number of ready inputs ``N``; ``CurConf`` is the kept configuration of the largest
``TotalBS <= N`` (below the smallest ``TotalBS``: the default workers ``{1, 2}``); the idle queue holds, per batch
size, as many idle workers as ``CurConf`` allows beyond those of that size still busy; then Algorithm 1 runs on
that queue. The offline search is cached per (latency table, ``total_bs``, length, profiler) where the profiler's
answers are computed (the simulator's), never where they are measured (the replay's). Parameters: ``total_bs`` and
``max_inf`` (as N-Ebird; ``TotalBS`` levels above ``max_inf`` are not profiled: the engine never holds more than
``max_inf`` alive anyway).

Assumptions where the paper is silent (all ours, documented here): the MaxInf rule above; ``CurConf`` by the
largest ``TotalBS`` not above ``N`` (the paper says only "MemState ... the total number of pending requests"; the
smallest ``TotalBS`` at or above ``N`` would let an engine of one worker of 8 wait forever for 8 inputs); a
configuration limits the workers *busy* per batch size, so a worker busy under a previous configuration finishes
its batch; the engine satisfying Table 4's configurations takes the maximum count per size (the paper's own
Table 4 lists an engine with fewer size-4 workers than its TotalBS = 16 configuration, so it cannot be read
literally); profiled combinations use sizes up to 32 (Equation 6) and the table's largest batch size.

The offline profile runs where the policy runs: the engine supplies the profiler and the pipeline hands it over
(``Pipeline(..., corun=...)``, passed on as ``instances_needed(..., corun=...)``); an E-Ebird pipeline built without
one is refused (a ConfigError), never profiled on something else.

* **The simulator** (:mod:`dvasim.engines.sim.corun`, built by ``dvasim.run``): a small SimPy simulation of exactly
  that co-run on the simulator's own device-sharing model, the ``fluid`` model of
  :mod:`dvasim.engines.sim.device` whatever ``[engine] sharing`` the run uses (**our offline profiler**, in place of
  the paper's GPU measurements). The paper's context-switch cost of many streams (its Fig. 7 beyond 64 streams,
  Fig. 12's slow many-small-worker cases) is not in the fluid model unless ``[engine] corun_slowdown`` > 1 is set
  for the run (the profile always uses 1). Its host costs: on a serving stack (:mod:`dvasim.server`) the engine
  charges every worker's batch more than its GPU time (the request's handling and the inputs' gathering and copy,
  the stage launches on the host's cores or under the interpreter lock, the synchronisation and the results' copy
  back, which hold the worker where the stack's batch thread idles the GPU between its batches); the profile
  charges each co-running worker through the very host model and per-batch costs the engine uses
  (:class:`dvasim.engines.sim.corun.WorkerCosts`) of the run's resolved stack (``[server]`` overrides, an
  ``[engine.host]``'s custom host and the run's ``[engine.transfer]`` included), or of the stack E-Ebird's
  ``stack`` parameter names (under the memory pool, E2bird's design; the simulator's profiler resolves the name).
  Without a stack that adds costs the profile is the GPU alone.
* **The replay** (:mod:`dvasim.engines.replay.corun`, built by ``prepare``): measured on the real stage modules the
  replay runs (CUDA graphs captured for the profile's own workers where the replay runs graphs): one whole-model
  pass per worker on synthetic inputs, all started together (a thread each; on a GPU each on its own CUDA stream),
  a warm-up then a few timed repetitions, the mean of the workers' latencies; cached per combination. The
  ``stack`` parameter does not apply there (the real host's costs are in the measurement).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable
from typing import Any, Protocol

from dvasim.core.arith import int_sum
from dvasim.core.pipeline import MAX_INSTANCES
from dvasim.errors import ConfigError
from dvasim.policies.base import FrontDoorPolicy, New, check_positive_int, register

PAPER_WORKERS = (1, 1, 2, 4, 8, 16)  # N-Ebird's engine, paper §7.2.1
PAPER_TOTAL_BS = (4, 8, 16, 32)  # E-Ebird's profiled loads, paper §7.3.2
SIZES = (1, 2, 4, 8, 16, 32)  # Equation 6's worker sizes 2^0 .. 2^5
DEFAULT_WORKERS = (1, 2)  # "two workers of size 1 and size 2 are kept by default" (§7.3.2)
MAX_WORKERS = MAX_INSTANCES  # one instance per worker
MAX_TOTAL_BS = 64  # E-Ebird's offline search: 1,827 combinations at 64 (0.6 s), 25,509 at 128 (19 s)


class CoRunProfiler(Protocol):
    """E-Ebird's offline profiler, supplied by the engine that runs the policy (the pipeline hands it over as
    ``instances_needed(..., corun=...)``): the simulator's runs the co-run on its device model
    (:class:`dvasim.engines.sim.corun.SimCoRun`), the replay's measures it on the real stages
    (:class:`dvasim.engines.replay.corun.ReplayCoRun`)."""

    def average_ms(self, batch_sizes: tuple[int, ...], seq_len: int | None) -> float:
        """The average latency (ms) of workers of ``batch_sizes`` that start together, each running one batch of
        its size through the whole model (inputs of length ``seq_len``; None for models without one)."""
        ...

    def cache_key(self) -> Hashable | None:
        """Beside the table's times the search reads, what decides the answers (the search is cached per table,
        loads, length and this key); None: the answers are measured, never reuse a search."""
        ...

    def describe(self) -> dict[str, Any]:
        """Entries for the policy's resolved config (what the profile ran on)."""
        ...


def _typical_len(profile, input_lengths) -> int | None:
    """The input length at which the policy reads whole-model times: None for tables without a seq_len, else the
    longest of the workload's lengths (or the table's longest profiled length when unknown)."""
    if getattr(profile, "seq_lens", None) is None:
        return None
    if input_lengths is not None and len(input_lengths):
        return int(max(input_lengths))
    return int(max(profile.seq_lens))


def default_max_inf(profile, qos_target_ms: float | None, fallback: int, seq_len: int | None = None) -> int:
    """Our MaxInf rule (module docstring): the largest profiled batch size ``b`` with ``2 T(b) <= qos_target_ms``."""
    if qos_target_ms is None or not math.isfinite(qos_target_ms):
        return fallback
    best = 0
    for b in getattr(profile, "batch_sizes", range(1, int(profile.max_batch_size) + 1)):
        b = int(b)
        if 2.0 * profile.remaining(0, b, seq_len) <= qos_target_ms:  # T(b): the whole model, alone
            best = b
    return best


def _check_sizes(field: str, value: Any, *, allow_empty: bool = False) -> list[int]:
    if isinstance(value, (str, bytes, dict)) or not isinstance(value, (list, tuple)):
        raise ConfigError(field, f"must be a list of integers >= 1, got {value!r}")
    if not value and not allow_empty:
        raise ConfigError(field, "must be a non-empty list of integers >= 1, e.g. [1, 1, 2, 4, 8, 16]")
    return [check_positive_int(field, v) for v in value]


class _Ebird(FrontDoorPolicy):
    """Algorithm 1's dispatch, shared by N-Ebird and E-Ebird (see the module docstring)."""

    conf_per_round = False  # does the idle queue depend on the number of ready inputs (E-Ebird's CurConf)?

    def __init__(self, max_inf=None):
        super().__init__()
        self.max_inf = None if max_inf is None else check_positive_int("policy.max_inf", max_inf)
        self._max_inf = self.max_inf
        self.sizes: list[int] = []  # batch size of each worker (lane)

    # the engine: one lane per worker ------------------------------------------------------------------
    def engine_workers(self, profile, qos_target_ms, input_lengths) -> list[int]:
        raise NotImplementedError

    def instances_needed(self, profile, qos_target_ms=None, input_lengths=None, served=None, corun=None) -> int:
        """Workers (one instance each) for this run; ``served``: the run's resolved serving stack (the pipeline's
        :class:`dvasim.server.resolve.StackRun`, plain data); ``corun``: the engine's :class:`CoRunProfiler`,
        which E-Ebird's offline search asks (the simulator's charges the served stack's costs unless E-Ebird's
        ``stack`` parameter names another)."""
        self.served = served
        self.corun = corun
        self.sizes = self.engine_workers(profile, qos_target_ms, input_lengths)
        return len(self.sizes)

    def bind(self, view) -> None:
        super().bind(view)
        if not self.sizes or len(self.sizes) != len(view.free_lane_indices()):
            # bound to a pipeline that did not ask for the workers (it must: Pipeline does)
            raise ConfigError("engine.instances", f"{self.name} needs one instance per worker; build the "
                                                  "Pipeline with this policy (it asks the policy for them)")
        top = view.profile.max_batch_size
        if max(self.sizes) > top:
            raise ConfigError("policy.workers", f"a worker of batch size {max(self.sizes)} exceeds the table's "
                                                f"largest profiled batch size {top}")
        L = _typical_len(view.profile, getattr(view, "input_lengths", None))
        if self.max_inf is None:  # every engine has a worker of 1 (checked, or added), so MaxInf >= 1 runs
            self._max_inf = max(default_max_inf(view.profile, view.qos_target_ms, int_sum(self.sizes), L), 1)

    def lane_batch_sizes(self, lane: int) -> list[int] | None:
        """A worker runs batches of exactly its own size (Algorithm 1 hands it ``batchsize`` inputs or none):
        lane ``lane``'s one size. None before the workers are chosen (``instances_needed``)."""
        if not self.sizes:
            return None
        return [self.sizes[lane]]

    @property
    def max_inf_used(self) -> int:
        """MaxInf as run (the given one, or the rule's)."""
        return self._max_inf

    def idle_queue(self, n_ready: int, taken: set[int]) -> list[int]:
        """Q: the idle workers (not in ``taken``, those dispatched in this round) that may take a batch, in the
        queue's order (largest batch size first)."""
        return sorted((k for k in self.view.free_lane_indices() if k not in taken), key=lambda k: (-self.sizes[k], k))

    def admit(self, now: float) -> list[New]:
        """Algorithm 1 (2): rounds of dispatch while a round dispatches something (the algorithms' ``while True``).
        Only E-Ebird's rounds can differ (a round changes MemState and so CurConf): N-Ebird's second round would
        start from the first one's leftover R with the workers that did not fit it, so it stops after one."""
        ops: list[New] = []
        taken: set[int] = set()
        alive = self.view.active_queries()
        while self.pending:
            n = len(self.pending)
            r = min(n, self._max_inf - alive)
            dispatched = False
            for k in self.idle_queue(n, taken):
                if r <= 0:
                    break
                b = self.sizes[k]
                if r >= b:
                    ops.append(New(self.take(b), lane=k))
                    taken.add(k)
                    r -= b
                    alive += b
                    dispatched = True
            if not dispatched or not self.conf_per_round:
                break
        return ops

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["max_inf"] = self._max_inf
        d["engine_workers"] = list(self.sizes)
        return d


@register
class NEbird(_Ebird):
    """E2bird's N-Ebird (TPDS'21 §7.2, Algorithm 1): elastic batches of exactly each idle worker's size, largest
    worker first, while fewer than ``max_inf`` inferences are alive. See :mod:`dvasim.policies.e2bird`."""

    name = "n-ebird"
    params = {
        "workers": "batch sizes of the multi-granularity engine's workers, one instance each (paper: "
                   "[1, 1, 2, 4, 8, 16])",
        "max_inf": "MaxInf: most inferences alive at once [largest b with 2 T(b) <= qos.target_ms]",
    }

    def __init__(self, workers=None, max_inf=None):
        super().__init__(max_inf)
        ws = list(PAPER_WORKERS) if workers is None else _check_sizes("policy.workers", workers)
        if len(ws) > MAX_WORKERS:
            raise ConfigError("policy.workers", f"at most {MAX_WORKERS} workers (one instance each), got {len(ws)}")
        if 1 not in ws:
            # without one, fewer ready inputs than the smallest worker would wait forever once the load stops
            raise ConfigError("policy.workers", f"needs a worker of batch size 1 (paper §7.2.1: [1, 1, 2, 4, ...] "
                                                f"can take any number of inputs), got {ws!r}")
        self.workers = ws

    def engine_workers(self, profile, qos_target_ms, input_lengths) -> list[int]:
        return list(self.workers)


# ----------------------------------------------------------------------------- E-Ebird's offline phase
def combinations(total: int, sizes=SIZES) -> list[tuple[int, ...]]:
    """Every ``[i, j, k, ...]`` (one count per size of ``sizes``) with ``sum(count * size) == total``
    (Equation 6), in lexicographic order of the counts."""
    out: list[tuple[int, ...]] = []

    def rec(idx: int, left: int, acc: list[int]) -> None:
        if idx == len(sizes):
            if left == 0:
                out.append(tuple(acc))
            return
        for c in range(left // sizes[idx] + 1):
            acc.append(c)
            rec(idx + 1, left - c * sizes[idx], acc)
            acc.pop()

    rec(0, total, [])
    return out


_OFFLINE: dict[tuple, dict[int, tuple[int, ...]]] = {}


def _best_combination(corun: CoRunProfiler, total: int, sizes: tuple[int, ...],
                      seq_len: int | None) -> tuple[int, ...]:
    """The counts (per size of ``sizes``) of the combination of TotalBS ``total`` with the lowest average co-run
    latency; ties: fewer workers, then larger workers first."""
    scored = []
    for counts in combinations(total, sizes):
        bs = tuple(s for s, c in zip(sizes, counts) for _ in range(c))
        avg = corun.average_ms(bs, seq_len)
        scored.append((avg, len(bs), tuple(-b for b in sorted(bs, reverse=True)), counts))
    return min(scored)[3]


def offline_search(profile, total_bs, corun: CoRunProfiler, seq_len: int | None = None) -> dict[int, tuple[int, ...]]:
    """E-Ebird's offline phase: for each TotalBS the counts (per size of :data:`SIZES`) of the combination with the
    lowest average co-run latency, as the engine's profiler ``corun`` gives it (:class:`CoRunProfiler`). Sizes
    up to the table's largest batch size. Cached per (table, total_bs, length, ``corun.cache_key()``) where that
    key is not None."""
    top = min(int(profile.max_batch_size), SIZES[-1])
    sizes = tuple(s for s in SIZES if s <= top)
    ck = corun.cache_key()
    key = None
    if ck is not None:
        sig = tuple((profile.latency(s, b, seq_len), profile.demand(s, b, seq_len))
                    for s in range(profile.n_stages) for b in sizes)
        key = (sig, tuple(total_bs), seq_len, ck)
        if key in _OFFLINE:
            return _OFFLINE[key]
    best = {total: tuple(_best_combination(corun, total, sizes, seq_len)) + (0,) * (len(SIZES) - len(sizes))
            for total in total_bs}
    if key is not None:
        _OFFLINE[key] = best
    return best


@register
class EEbird(_Ebird):
    """E2bird's E-Ebird (TPDS'21 §7.3, Algorithm 2): N-Ebird's dispatch on the engine configuration profiled best
    (offline, by the engine's co-run profiler: the simulator's device model, or the replay's real stages) for the
    current number of ready inputs. See :mod:`dvasim.policies.e2bird`."""

    needs_corun = True  # the engine must hand the pipeline a CoRunProfiler (Pipeline(..., corun=...))

    name = "e-ebird"
    params = {
        "total_bs": "the loads (TotalBS) profiled offline (paper: [4, 8, 16, 32])",
        "max_inf": "MaxInf: most inferences alive at once [largest b with 2 T(b) <= qos.target_ms]",
        "stack": "the serving stack whose per-batch host costs the simulator's offline search charges every "
                 "worker (default: the run's own stack, as the pipeline names it; none, the GPU alone, where it "
                 "names none; the replay measures the real stages instead)",
    }

    def __init__(self, total_bs=None, max_inf=None, stack=None):
        super().__init__(max_inf)
        if stack is not None and not isinstance(stack, str):  # the engine's profiler resolves the name
            raise ConfigError("policy.stack", f"must be a serving stack's name, got {stack!r}")
        self.stack = stack
        self.corun: CoRunProfiler | None = None
        levels = list(PAPER_TOTAL_BS) if total_bs is None else _check_sizes("policy.total_bs", total_bs)
        if len(set(levels)) != len(levels):
            raise ConfigError("policy.total_bs", f"must not repeat a value, got {levels!r}")
        if max(levels) > MAX_TOTAL_BS:
            raise ConfigError("policy.total_bs", f"at most {MAX_TOTAL_BS} (the offline search's combinations grow "
                                                 f"fast), got {max(levels)}")
        self.total_bs = sorted(levels)
        self.engine_confs: dict[int, tuple[int, ...]] = {}
        self._levels: list[int] = []

    def engine_workers(self, profile, qos_target_ms, input_lengths) -> list[int]:
        L = _typical_len(profile, input_lengths)
        if self.max_inf is None:
            cap = max(default_max_inf(profile, qos_target_ms, max(self.total_bs), L), 1)
        else:
            cap = self.max_inf
        top = int(profile.max_batch_size)
        self._levels = [t for t in self.total_bs if t <= cap]
        if self.corun is None:
            raise ConfigError("policy", f"{self.name}'s offline search needs a co-run profiler, which the engine "
                                        "running it must supply: build the Pipeline with corun=... (dvasim.run "
                                        "and the replay do)")
        self.engine_confs = offline_search(profile, self._levels, self.corun, L)
        need: Counter = Counter({s: 1 for s in DEFAULT_WORKERS if s <= top})
        for counts in self.engine_confs.values():
            for s, c in zip(SIZES, counts):
                need[s] = max(need[s], c)
        workers = sorted((s for s, c in need.items() for _ in range(c)), reverse=True)
        if len(workers) > MAX_WORKERS:
            raise ConfigError("policy.total_bs", f"the profiled configurations need {len(workers)} workers; at most "
                                                 f"{MAX_WORKERS}: profile smaller loads")
        return workers

    conf_per_round = True

    def bind(self, view) -> None:
        super().bind(view)
        self._lanes_of = {s: [k for k, z in enumerate(self.sizes) if z == s] for s in set(self.sizes)}

    def current_conf(self, n_ready: int) -> dict[int, int]:
        """CurConf for ``n_ready`` ready inputs: worker count per batch size."""
        level = max((t for t in self._levels if t <= n_ready), default=None)
        if level is None:
            return {s: 1 for s in DEFAULT_WORKERS}
        return {s: c for s, c in zip(SIZES, self.engine_confs[level]) if c}

    def idle_queue(self, n_ready: int, taken: set[int]) -> list[int]:
        conf = self.current_conf(n_ready)
        free = set(self.view.free_lane_indices()) - taken
        q = []
        for s, c in conf.items():  # a configuration limits the workers busy per size
            lanes = self._lanes_of.get(s, ())
            idle = [k for k in lanes if k in free]  # in index order
            room = c - (len(lanes) - len(idle))
            if room > 0:
                q.extend(idle[:room])
        return sorted(q, key=lambda k: (-self.sizes[k], k))

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["engine_confs"] = {str(t): list(c) for t, c in self.engine_confs.items()}
        if self.corun is not None:  # what the profile ran on (the simulator: the stack's costs it charged)
            d.update(self.corun.describe())
        return d
