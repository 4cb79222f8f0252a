"""The :class:`Workload` (arrival times + input lengths) and its construction from a ``[workload]`` TOML table.

``[workload]`` keys (``kind`` is required):

=============  ===========================================================================================
kind           ``"poisson"`` | ``"gamma"`` | ``"uniform"`` | ``"explicit"`` | ``"closed"`` | ``"stepping"`` | ``"phases"`` | ``"trace"``
poisson        ``rate_qps`` (> 0), ``n_queries`` (int > 0), ``seed`` (int >= 0, default 0), ``start_ms`` (>= 0, default 0)
gamma          as poisson, plus ``cv`` (> 0): i.i.d. Gamma gaps with mean ``1000 / rate_qps`` ms and coefficient of
               variation ``cv`` (``cv = 1`` is poisson, < 1 smoother, > 1 burstier); see ``gamma_arrivals``
uniform        ``rate_qps``, ``n_queries``, ``start_ms``; ``seed`` (only used to sample lengths)
explicit       ``arrivals_ms`` (list of numbers >= 0, any order: sorted with a stable permutation that is
               also applied to ``seq_lens``), optional ``seq_lens`` (list of ints >= 1, same length), ``seed``
closed         ``clients`` (int > 0, default 1), ``n_queries``, ``think_ms`` (>= 0, default 0), ``seed``: a closed
               loop; each client sends its next query when the previous one is answered (plus think time)
phases         ``phases`` (a list of ``{n = 150, rate_qps = 40}`` tables: ``n`` queries at ``rate_qps``, one phase
               after the other; E2bird's diurnal load is two phases), ``seed`` (0), ``poisson`` (true),
               ``start_ms`` (0); see :func:`dvasim.workload.arrivals.phases_arrivals`
stepping       ``start_qps`` (66), ``end_qps`` (4000), ``step_queries`` (2000), ``n_queries`` (32000), ``seed``
               (0), ``poisson`` (true), ``start_ms`` (0); see :func:`dvasim.workload.arrivals.stepping_arrivals`
trace          ``path`` (a CSV / JSON / Parquet file of request times, or ``"trace:<name>"`` for one shipped in
               ``traces/arrivals/``, e.g. ``"trace:azure_code"``), ``column`` (default: the first of ``arrival_ms``,
               ``timestamp_ms``, ``timestamp``, ``time``, ``arrival``), ``unit`` (``"ms"`` | ``"s"`` | ``"us"``;
               date-time strings are parsed), ``length_column`` (input lengths from the file; instead of
               seq_len / seq_len_dist), ``n_queries`` (default: every request; more loops the trace),
               ``rate_qps`` (scale time to this mean rate) or ``time_scale`` (multiply the gaps), ``start_ms``
               (the first request's arrival, default 0), ``seed`` (lengths only); see :mod:`dvasim.workload.traces`
priorities     ``priority_mix = [0.2, 0.8]`` (any kind): each query's priority level, 1 (the highest) to
               ``len(priority_mix)``, drawn i.i.d. with these probabilities (they sum to 1) for Triton's batcher
               with priority levels (policy ``"triton"``); absent: every query at the policy's default level
lengths        ``seq_len = N`` (constant) or ``seq_len_dist = "glue:RTE"`` / ``"path/to/lengths.csv"`` (sampled
               i.i.d. with replacement); not both. For ``explicit`` with ``seq_lens`` neither may be given.
=============  ===========================================================================================

Random streams: arrivals use ``Generator(PCG64(seed))``; sampled lengths use an independent stream,
``Generator(PCG64(SeedSequence(seed, spawn_key=(1,))))`` (== ``SeedSequence(seed).spawn(2)[1]``), so changing
the length distribution never changes the arrival times; priorities use a third,
``Generator(PCG64(SeedSequence(seed, spawn_key=(2,))))``, so adding ``priority_mix`` changes neither. The same section and seed give identical arrays.

If the model has no sequence dimension (``needs_seq_len=False``) all lengths are 1 and ``seq_len`` /
``seq_len_dist`` are ignored (not even loaded; explicit ``seq_lens`` are still checked for alignment).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dvasim.errors import ConfigError, WorkloadError
from dvasim.schema import MAX_FACTOR, Key, Section
from dvasim.workload.arrivals import (
    CV_RANGE,
    MAX_START_MS,
    _check_count,
    _check_rate,
    _check_seed,
    _check_start,
    gamma_arrivals,
    phases_arrivals,
    poisson_arrivals,
    stepping_arrivals,
    uniform_arrivals,
)
from dvasim.workload.lengths import load_lengths
from dvasim.workload.traces import load_trace, trace_arrivals

__all__ = ["Workload", "workload_from_config", "KINDS", "WORKLOAD", "length_rng", "priority_draws", "priority_rng"]

_LEN_KEYS = ("seq_len", "seq_len_dist")
MAX_BACKLOG = 20_000_000  # as many queries as one run may take (dvasim.workload.arrivals.MAX_QUERIES)
MAX_SEED = 2**63 - 1  # numpy's seed sequences take any int; records and caches keep it as an int64
# an explicit arrival is at most ten times start_ms's bound (MAX_START_MS: a start there, then up to 9e12 ms of arrivals;
# 317 years): the clock still resolves 2 us there (float64 spacing 0.002 ms); at 1e308 every latency rounds to 0
MAX_ARRIVAL_MS = 10 * MAX_START_MS
KINDS = ("poisson", "gamma", "uniform", "explicit", "stepping", "phases", "closed", "trace")
_RATE = ("poisson", "gamma", "uniform")
_ALL_BUT_EXPLICIT = ("poisson", "gamma", "uniform", "stepping", "phases", "closed", "trace")
WORKLOAD = Section("workload", "the queries: their arrival times and input lengths; `kind` picks the process", (
    Key("kind", "choice", "the arrival process", choices=KINDS),
    Key("rate_qps", "number", "mean arrival rate, queries per second (trace: scale the trace to this mean rate)",
        minimum=0, strict=True, kinds=(*_RATE, "trace")),
    Key("cv", "number", "coefficient of variation of the Gamma gaps (1 = poisson, < 1 smoother, > 1 burstier; "
        "1e-06 to 1000: the Gamma shape 1 / cv^2 stays a finite, non-zero number)", minimum=CV_RANGE[0],
        maximum=CV_RANGE[1], kinds=("gamma",)),
    Key("n_queries", "int", "queries in the run (stepping: 32000; trace: every request, more loops it)",
        minimum=1, kinds=(*_RATE, "stepping", "closed", "trace")),
    Key("seed", "int", "seed of the arrivals' and the lengths' random streams (at most 2**63 - 1)", default=0,
        minimum=0, maximum=MAX_SEED),
    Key("start_ms", "number", "arrival time of the first query (ms, at most 1e12: the clock's resolution)",
        default=0.0, minimum=0, maximum=1e12, kinds=(*_RATE, "stepping", "phases", "trace")),
    Key("arrivals_ms", "any", "a list of arrival times >= 0 (ms, any order: sorted stably, seq_lens with them)",
        kinds=("explicit",)),
    Key("seq_lens", "any", "a list of one input length (an integer >= 1) per arrival", kinds=("explicit",)),
    Key("start_qps", "number", "stepping: the first level's rate", default=66.0, minimum=0, strict=True,
        kinds=("stepping",)),
    Key("end_qps", "number", "stepping: the rate reached after n_queries - step_queries queries", default=4000.0,
        minimum=0, strict=True, kinds=("stepping",)),
    Key("step_queries", "int", "stepping: queries per level", default=2000, minimum=1, kinds=("stepping",)),
    Key("poisson", "bool", "Poisson arrivals within each level or phase (false: constant gaps)", default=True,
        kinds=("stepping", "phases")),
    Key("phases", "list", "a list of {n = 150, rate_qps = 40} tables: n queries at rate_qps, one after the other",
        kinds=("phases",)),
    Key("clients", "int", "closed loop: clients, each sending its next query when the last is answered", default=1,
        minimum=1, kinds=("closed",)),
    Key("think_ms", "number", "closed loop: a client's pause between an answer and its next query (ms)",
        default=0.0, minimum=0, kinds=("closed",)),
    Key("path", "path", 'a CSV / JSON / Parquet file of request times, or "trace:<name>" for one in '
        "traces/arrivals/ (e.g. \"trace:azure_code\")", kinds=("trace",)),
    Key("column", "str", "the time column (default: the first of arrival_ms, timestamp_ms, timestamp, time, "
        "arrival)", kinds=("trace",)),
    Key("unit", "choice", "the time column's unit (date-time strings are parsed)", default="ms",
        choices=("ms", "s", "us"), kinds=("trace",)),
    Key("length_column", "str", "input lengths from this column of the trace (instead of seq_len / seq_len_dist)",
        kinds=("trace",)),
    Key("time_scale", "number", "multiply the trace's gaps (instead of rate_qps)", minimum=1 / MAX_FACTOR,
        maximum=MAX_FACTOR, kinds=("trace",)),
    Key("seq_len", "int", "every query's input length (tables with a seq_len column)", minimum=1),
    Key("seq_len_dist", "str", 'input lengths sampled i.i.d. from "glue:RTE" (a GLUE task) or a lengths CSV',
        ),
    Key("backlog", "int", "queries already waiting when the run starts: that many more queries arrive at start_ms, "
        "before the stream (the trigger test of a metastable server; their lengths repeat the stream's first ones)",
        default=0, minimum=0, maximum=MAX_BACKLOG, kinds=(*_RATE, "stepping", "phases", "trace")),
    Key("priority_mix", "numbers", "the share of queries at each priority level, 1 (the highest) first, summing to 1 "
        '(Triton\'s batcher with priority levels, policy "triton"; drawn from its own seeded stream); absent: every '
        "query at the policy's default level", minimum=0),
), selector="kind")


@dataclass(frozen=True)
class Workload:
    """Queries to serve: arrival time (ms) and input length of each, in arrival order.

    Arrays are converted to float64 / int64 and made read-only. ``WorkloadError`` if invalid.
    """

    arrivals_ms: np.ndarray
    seq_lens: np.ndarray
    description: str = ""
    closed_clients: int | None = None  # closed loop: arrivals are decided by the engine
    think_ms: float = 0.0
    priorities: np.ndarray | None = None  # each query's priority level (1 = highest), or None: all at the default

    def __post_init__(self):
        arr = np.array(self.arrivals_ms, dtype=np.float64, copy=True)
        raw_lens = np.asarray(self.seq_lens)
        if arr.ndim != 1 or arr.size == 0:
            raise WorkloadError("workload.arrivals_ms", f"must be a non-empty 1-D array, got shape {arr.shape}")
        if not np.all(np.isfinite(arr)) or np.any(arr < 0):
            raise WorkloadError("workload.arrivals_ms", "must be finite and >= 0 (ms)")
        if np.any(np.diff(arr) < 0):
            i = int(np.flatnonzero(np.diff(arr) < 0)[0])
            raise WorkloadError(
                "workload.arrivals_ms", f"must be non-decreasing; entry {i + 1} ({arr[i + 1]}) < entry {i} ({arr[i]}); sort them"
            )
        if raw_lens.shape != arr.shape:
            raise WorkloadError(
                "workload.seq_lens", f"must have one entry per arrival ({arr.size}), got shape {raw_lens.shape}"
            )
        if raw_lens.dtype.kind not in "iuf" or (
            raw_lens.dtype.kind == "f" and (not np.all(np.isfinite(raw_lens)) or np.any(raw_lens != np.round(raw_lens)))
        ):
            raise WorkloadError("workload.seq_lens", "must be integers >= 1")
        lens = raw_lens.astype(np.int64)
        if np.any(lens < 1):
            raise WorkloadError("workload.seq_lens", f"must be integers >= 1, got {int(lens.min())}")
        arr.setflags(write=False)
        lens.setflags(write=False)
        if self.priorities is not None:
            pri = np.array(self.priorities, dtype=np.int64, copy=True)
            if pri.shape != arr.shape or np.any(pri < 0):
                got = f"shape {pri.shape}" if pri.shape != arr.shape else f"level {int(pri.min())}"
                raise WorkloadError("workload.priority_mix", f"must give one priority level >= 0 per arrival "
                                                             f"({arr.size}), got {got}")
            pri.setflags(write=False)
            object.__setattr__(self, "priorities", pri)
        object.__setattr__(self, "arrivals_ms", arr)
        object.__setattr__(self, "seq_lens", lens)
        object.__setattr__(self, "description", str(self.description))

    def __len__(self) -> int:
        return int(self.arrivals_ms.size)

    @property
    def n_queries(self) -> int:
        return int(self.arrivals_ms.size)


MAX_PRIORITY_LEVELS = 64  # levels priority_mix may name (Triton's levels are many more; a mix lists each one)


def priority_draws(mix, n: int, seed: int) -> np.ndarray:
    """Each of ``n`` queries' priority level (1 = the highest), i.i.d. with the probabilities ``mix`` (one per
    level, summing to 1), from the stream :func:`priority_rng` (``seed``): the same mix and seed give the same
    levels, and the arrivals and lengths are not touched."""
    p = _number_list("priority_mix", mix, integer=False, low=0)
    if len(p) > MAX_PRIORITY_LEVELS:
        raise ConfigError("workload.priority_mix", f"{len(p)} levels; at most {MAX_PRIORITY_LEVELS}")
    if abs(float(p.sum()) - 1.0) > 1e-9:
        raise ConfigError("workload.priority_mix", f"the shares must sum to 1, got {float(p.sum()):.6g}; e.g. "
                                                   "[0.2, 0.8]: 20% at level 1, 80% at level 2")
    return priority_rng(seed).choice(len(p), size=n, p=p / p.sum()).astype(np.int64) + 1


def priority_rng(seed: int) -> np.random.Generator:
    """The generator priorities are drawn from (independent of the arrivals' and the lengths' streams)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(2,))))


def length_rng(seed: int) -> np.random.Generator:
    """The generator used to sample input lengths (a stream independent of the arrivals' ``PCG64(seed)``)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(1,))))


def _number_list(key: str, value, *, integer: bool, low: float, high: float | None = None) -> np.ndarray:
    what = f"a list of integers >= {low:g}" if integer else f"a list of numbers >= {low:g}"
    if high is not None:
        what = f"a list of numbers in [{low:g}, {high:g}]"
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence | np.ndarray):
        raise ConfigError(f"workload.{key}", f"must be {what}, got {type(value).__name__}")
    items = list(value)
    if not items:
        raise ConfigError(f"workload.{key}", f"must be {what} with at least one entry, got an empty list")
    ok_types = (int, np.integer) if integer else (int, float, np.integer, np.floating)
    for i, x in enumerate(items):
        if isinstance(x, bool | np.bool_) or not isinstance(x, ok_types):
            raise ConfigError(f"workload.{key}", f"must be {what}; entry {i} is {x!r}")
        if not math.isfinite(x) or x < low or (high is not None and x > high):
            raise ConfigError(f"workload.{key}", f"must be {what}; entry {i} is {x!r}")
    return np.asarray(items, dtype=np.int64 if integer else np.float64)


def _positive_int(key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ConfigError(f"workload.{key}", f"must be an integer >= 1, got {value!r}")
    return int(value)


def _trace_workload(section: Mapping, path, needs_seq_len: bool,
                    base_dir: str | Path | None) -> tuple[np.ndarray, np.ndarray | None, str]:
    """(arrivals, lengths from the file or None, description) of a ``kind = "trace"`` section."""
    for key in ("column", "length_column"):
        if key in section and (not isinstance(section[key], str) or section[key].strip() == ""):
            raise ConfigError(f"workload.{key}", f"must be a column name (string), got {section[key]!r}")
    if "length_column" in section and needs_seq_len and any(k in section for k in _LEN_KEYS):
        raise ConfigError("workload.length_column", "give either length_column or seq_len / seq_len_dist, not both")
    if "rate_qps" in section and "time_scale" in section:
        raise ConfigError("workload.time_scale", "set only one of rate_qps (scale to a mean rate) or time_scale")
    rate = _check_rate("rate_qps", section["rate_qps"]) if "rate_qps" in section else None
    scale = None
    if "time_scale" in section:
        scale = section["time_scale"]
        if (isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale)
                or not 1 / MAX_FACTOR <= scale <= MAX_FACTOR):
            raise ConfigError("workload.time_scale", f"must be a number in [{1 / MAX_FACTOR:g}, {MAX_FACTOR:g}] "
                                                     f"(multiplies every gap), got {scale!r}")
        scale = float(scale)
    n = _check_count("n_queries", section["n_queries"]) if "n_queries" in section else None
    start = _check_start(section.get("start_ms", 0.0))
    trace = load_trace(path, column=section.get("column"), unit=section.get("unit", "ms"),
                       length_column=section.get("length_column"), base_dir=base_dir)
    if n is None:
        _check_count("n_queries", len(trace))
    arrivals, lens = trace_arrivals(trace, n_queries=n, rate_qps=rate, time_scale=scale, start_ms=start)
    m = arrivals.size
    looped = f", looped {m / len(trace):.3g} times" if m > len(trace) else ""
    if rate is not None:
        timing = f", scaled to {rate:g} QPS"
    elif scale is not None:
        timing = f", time x {scale:g}"
    else:
        timing = ""
    desc = f"trace {path} ({len(trace)} requests): {m} queries{looped}{timing}"
    return arrivals, lens, desc


def workload_from_config(
    section: Mapping, *, needs_seq_len: bool, base_dir: str | Path | None = None
) -> Workload:
    """Build the :class:`Workload` described by a ``[workload]`` table (see the module docstring).

    ``needs_seq_len``: whether the model's latency table has a ``seq_len`` column. ``base_dir``: directory
    that relative ``seq_len_dist`` paths are resolved against (the config file's directory); default: cwd.
    """
    if not isinstance(section, Mapping):
        raise ConfigError("workload", f"must be a table ([workload] with kind = ...), got {type(section).__name__}")
    kind = section.get("kind")
    if kind is None:
        raise ConfigError("workload.kind", f"missing; set kind = one of {', '.join(repr(k) for k in KINDS)}")
    WORKLOAD.check(dict(section))  # unknown keys, types and ranges: one line naming the key
    seed = _check_seed(section.get("seed", WORKLOAD.default("seed")))
    arrivals, explicit_lens, desc, closed = _ARRIVALS[kind](_Keys(section, kind), seed, needs_seq_len, base_dir)
    if closed is None and arrivals.size and not float(arrivals.max()) <= MAX_ARRIVAL_MS:  # (nan and inf too)
        at_fault = {"stepping": "workload.start_qps", "phases": "workload.phases", "explicit": "workload.arrivals_ms",
                    "trace": "workload.time_scale" if "time_scale" in section else "workload.n_queries"}
        raise ConfigError(at_fault.get(kind, "workload.rate_qps"),
                          f"the {arrivals.size:,} arrivals would reach {float(arrivals.max()):.3g} ms, beyond "
                          f"{MAX_ARRIVAL_MS:g} ms (317 years, where the clock still resolves 2 us); give a higher rate "
                          "or fewer queries")
    lens, desc = _lengths(section, kind, arrivals.size, explicit_lens, desc, seed, needs_seq_len, base_dir)
    priorities = None
    if "priority_mix" in section:
        priorities = priority_draws(section["priority_mix"], arrivals.size, seed)
        desc += f", priorities ~ {list(section['priority_mix'])} (seed {seed})"
    backlog = int(section.get("backlog", 0))
    if backlog and arrivals.size + backlog > MAX_BACKLOG:
        raise ConfigError("workload.backlog", f"{backlog:,} more queries than the stream's {arrivals.size:,} exceed "
                                              f"the {MAX_BACKLOG:,} one run may take; give a smaller backlog")
    if backlog:  # the stream is the run without a backlog, untouched; the backlog's queries come first
        arrivals, lens, priorities = with_backlog(backlog, arrivals, lens, priorities, _check_start(
            section.get("start_ms", 0.0)))
        desc += f", after a backlog of {backlog} queries at {float(section.get('start_ms', 0.0)):g} ms"
    if closed is not None:
        return Workload(arrivals_ms=arrivals, seq_lens=lens, description=desc, closed_clients=closed[0],
                        think_ms=closed[1], priorities=priorities)
    return Workload(arrivals_ms=arrivals, seq_lens=lens, description=desc, priorities=priorities)


def with_backlog(backlog: int, arrivals: np.ndarray, lens: np.ndarray, priorities: np.ndarray | None,
                 start_ms: float) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``backlog`` queries arriving at ``start_ms`` put before a stream (``arrivals``, ``lens``, ``priorities``):
    the queue filled when the stream starts. Their lengths and priorities repeat the stream's first ones (cyclically),
    so the stream keeps its own arrays exactly, and the backlog has its mix."""
    idx = np.arange(backlog) % arrivals.size
    start = min(float(start_ms), float(arrivals[0]))
    arr = np.concatenate([np.full(backlog, start), arrivals])
    pri = None if priorities is None else np.concatenate([priorities[idx], priorities])
    return arr, np.concatenate([lens[idx], lens]), pri


class _Keys:
    """A workload section read by a builder: ``req`` (required), ``get`` (the schema's default when absent)."""

    def __init__(self, section: Mapping, kind: str):
        self.section, self.kind = section, kind

    def __contains__(self, key: str) -> bool:
        return key in self.section

    def __getitem__(self, key: str):
        return self.section[key]

    def req(self, key: str):
        if key not in self.section:
            raise ConfigError(f"workload.{key}", f"missing; kind = \"{self.kind}\" needs {key}")
        return self.section[key]

    def get(self, key: str):
        return self.section.get(key, WORKLOAD.default(key))


def _poisson(s: _Keys, seed: int, needs_seq_len: bool, base_dir):
    rate, n = _check_rate("rate_qps", s.req("rate_qps")), _check_count("n_queries", s.req("n_queries"))
    arrivals = poisson_arrivals(rate, n, seed, _check_start(s.get("start_ms")))
    return arrivals, None, f"poisson {rate:g} QPS x {n} queries (seed {seed})", None


def _gamma(s: _Keys, seed: int, needs_seq_len: bool, base_dir):
    rate, cv = _check_rate("rate_qps", s.req("rate_qps")), s.req("cv")
    n = _check_count("n_queries", s.req("n_queries"))
    arrivals = gamma_arrivals(rate, cv, n, seed, _check_start(s.get("start_ms")))
    return arrivals, None, f"gamma {rate:g} QPS, cv {float(cv):g} x {n} queries (seed {seed})", None


def _trace(s: _Keys, seed: int, needs_seq_len: bool, base_dir):
    return (*_trace_workload(s.section, s.req("path"), needs_seq_len, base_dir), None)


def _uniform(s: _Keys, seed: int, needs_seq_len: bool, base_dir):
    rate, n = _check_rate("rate_qps", s.req("rate_qps")), _check_count("n_queries", s.req("n_queries"))
    arrivals = uniform_arrivals(rate, n, _check_start(s.get("start_ms")))
    return arrivals, None, f"uniform {rate:g} QPS x {n} queries", None


def _explicit(s: _Keys, seed: int, needs_seq_len: bool, base_dir):
    raw = _number_list("arrivals_ms", s.req("arrivals_ms"), integer=False, low=0, high=MAX_ARRIVAL_MS)
    perm = np.argsort(raw, kind="stable")
    explicit_lens = None
    if "seq_lens" in s:
        lens = _number_list("seq_lens", s["seq_lens"], integer=True, low=1)
        if lens.size != raw.size:
            raise ConfigError(
                "workload.seq_lens", f"must have one entry per arrival ({raw.size} in arrivals_ms), got {lens.size}"
            )
        if needs_seq_len and any(k in s for k in _LEN_KEYS):
            raise ConfigError("workload.seq_lens", "give either seq_lens or seq_len / seq_len_dist, not both")
        explicit_lens = lens[perm]
    return raw[perm], explicit_lens, f"explicit {raw.size} arrivals", None


def _phases(s: _Keys, seed: int, needs_seq_len: bool, base_dir):
    poisson = s.get("poisson")
    arrivals, _ = phases_arrivals(s.req("phases"), seed, poisson, s.get("start_ms"))
    parts = " then ".join(f"{p['n']} at {float(p['rate_qps']):g} QPS" for p in s["phases"])
    return arrivals, None, f"phases {parts} ({'poisson' if poisson else 'constant gaps'}, seed {seed})", None


def _closed(s: _Keys, seed: int, needs_seq_len: bool, base_dir):
    clients = _check_count("clients", s.get("clients"))
    n = _check_count("n_queries", s.req("n_queries"))
    think = float(s.get("think_ms"))
    desc = f"closed loop: {clients} clients x {n} queries, think {think:g} ms"
    return np.zeros(n), None, desc, (clients, think)


def _stepping(s: _Keys, seed: int, needs_seq_len: bool, base_dir):
    start_qps, end_qps = _check_rate("start_qps", s.get("start_qps")), _check_rate("end_qps", s.get("end_qps"))
    step = _check_count("step_queries", s.get("step_queries"))
    n = _check_count("n_queries", s.section.get("n_queries", STEPPING_QUERIES))
    poisson = s.get("poisson")
    arrivals, _ = stepping_arrivals(start_qps, end_qps, step, n, seed, poisson, _check_start(s.get("start_ms")))
    desc = (f"stepping {start_qps:g}->{end_qps:g} QPS every {step} queries x {n} queries "
            f"({'poisson' if poisson else 'constant gaps'}, seed {seed})")
    return arrivals, None, desc, None


STEPPING_QUERIES = 32000  # the paper's stepping load (§8.3): 66 -> 4000 QPS in 2000-query levels
_ARRIVALS = {"poisson": _poisson, "gamma": _gamma, "trace": _trace, "uniform": _uniform, "explicit": _explicit,
             "phases": _phases, "closed": _closed, "stepping": _stepping}


def _lengths(section: Mapping, kind: str, n: int, explicit_lens, desc: str, seed: int, needs_seq_len: bool,
             base_dir) -> tuple[np.ndarray, str]:
    """Every query's input length (and the description's words for them)."""
    if not needs_seq_len:
        return np.ones(n, dtype=np.int64), desc
    if explicit_lens is not None:
        return explicit_lens, desc + (f", seq_len from column {section['length_column']!r}" if kind == "trace"
                                      else ", explicit seq_lens")
    if "seq_len" in section and "seq_len_dist" in section:
        raise ConfigError("workload.seq_len_dist", "set only one of seq_len (constant) or seq_len_dist (distribution)")
    if "seq_len" in section:
        c = _positive_int("seq_len", section["seq_len"])
        return np.full(n, c, dtype=np.int64), desc + f", seq_len {c}"
    if "seq_len_dist" in section:
        spec = section["seq_len_dist"]
        pool = load_lengths(spec, base_dir=base_dir)
        return length_rng(seed).choice(pool, size=n, replace=True), desc + f", seq_len ~ {spec} (seed {seed})"
    raise ConfigError(
        "workload.seq_len",
        "the model's latency table has a seq_len column, so queries need input lengths: "
        "set seq_len = N or seq_len_dist = \"glue:RTE\""
        + (" or length_column = \"<column of the trace>\"" if kind == "trace" else ""),
    )
