"""Query arrival processes. All times are in milliseconds; rates in queries per second (QPS).

* ``poisson_arrivals``: a Poisson process started at ``start_ms``: i.i.d. exponential inter-arrival gaps
  with mean ``1000 / rate_qps`` ms drawn from ``numpy.random.Generator(PCG64(seed))``; the first query arrives
  one gap after ``start_ms``.
* ``gamma_arrivals``: a renewal process with i.i.d. Gamma inter-arrival gaps of mean ``1000 / rate_qps`` ms and
  coefficient of variation ``cv`` (shape ``1 / cv**2``, scale ``mean * cv**2``), drawn from
  ``numpy.random.Generator(PCG64(seed))``; the first query arrives one gap after ``start_ms``. ``cv = 1`` is the
  Poisson process (numpy draws Gamma(1) as an exponential, so the arrivals equal ``poisson_arrivals``'); ``cv < 1``
  is smoother, ``cv > 1`` burstier.
* ``uniform_arrivals``: a constant interval of ``1000 / rate_qps`` ms; the first query arrives at ``start_ms``.
* ``stepping_arrivals``: the stepping load of the DVABatch paper (Sec. 8.3): the load starts low (66 QPS)
  and is raised every ``step_queries`` (2000) queries until it reaches ``end_qps`` (4000 QPS) after 30000
  queries. The paper does not give the intermediate levels; we use **geometric** steps: with
  ``n_steps = ceil(n_queries / step_queries)`` levels, level ``k`` (queries ``k*step_queries`` ..
  ``(k+1)*step_queries - 1``) runs at ``start_qps * (end_qps / start_qps) ** (k / (n_steps - 1))``, so the last
  level is exactly ``end_qps`` (with the defaults, 16 levels, the last starting at query 30000; consecutive
  levels differ by a factor of about 1.31). Geometric rather than linear because the range spans 60x: linear
  steps of ~262 QPS would leave only one level in the low-load region. With a single level the rate is
  ``start_qps``. The gap *before* query ``i`` uses query ``i``'s level: exponential (``poisson=True``,
  ``Generator(PCG64(seed))``) or constant ``1000 / rate``; arrivals are cumulative sums of the gaps after
  ``start_ms`` (so the first query arrives one gap after ``start_ms``).

Invalid arguments raise :class:`dvasim.errors.ConfigError` naming the ``workload.<argument>`` field.
"""

from __future__ import annotations

import math

import numpy as np

from dvasim.errors import ConfigError
from dvasim.schema import MAX_QPS, MIN_QPS

__all__ = ["poisson_arrivals", "gamma_arrivals", "uniform_arrivals", "stepping_arrivals", "stepping_rates"]


def _check_rate(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ConfigError(f"workload.{name}", f"must be a number > 0 (queries per second), got {value!r}")
    if not math.isfinite(value) or not MIN_QPS <= value <= MAX_QPS:  # a mean gap of at most MAX_MS, at least 1 ns
        raise ConfigError(f"workload.{name}", f"must be a number in [{MIN_QPS:g}, {MAX_QPS:g}] (queries per second), "
                                              f"got {value!r}")
    return float(value)


# one run keeps about 36 bytes a query in memory and streams its records (10 million: under 1 GiB, ~7 minutes
# here); 20 million is the most one run takes
MAX_QUERIES = 20_000_000


def _check_count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ConfigError(f"workload.{name}", f"must be an integer > 0, got {value!r}")
    if value <= 0:
        raise ConfigError(f"workload.{name}", f"must be an integer > 0, got {value!r}")
    if value > MAX_QUERIES:
        raise ConfigError(f"workload.{name}", f"at most {MAX_QUERIES:,} in one run (about 36 bytes a query stay "
                                              f"in memory and a run takes minutes per million), got {value:,}; "
                                              "split the study into runs")
    return int(value)


def _check_seed(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise ConfigError("workload.seed", f"must be an integer >= 0, got {value!r}")
    return int(value)


MAX_START_MS = 1e12  # about 31.7 years: the simulated clock still resolves 0.12 us there (float64 spacing)


def _check_start(value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ConfigError("workload.start_ms", f"must be a number >= 0 (ms), got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ConfigError("workload.start_ms", f"must be a finite number >= 0 (ms), got {value!r}")
    if value > MAX_START_MS:
        # issue 34: at 1e308 ms every latency rounded to 0 and the run was judged stable
        raise ConfigError("workload.start_ms", f"must be at most {MAX_START_MS:.0e} ms (about 31.7 years, where the "
                                               f"clock still resolves 0.12 us), got {value!r}")
    return float(value)


def poisson_arrivals(rate_qps: float, n_queries: int, seed: int, start_ms: float = 0.0) -> np.ndarray:
    """Arrival times (ms) of ``n_queries`` queries of a Poisson process at ``rate_qps``, after ``start_ms``."""
    rate = _check_rate("rate_qps", rate_qps)
    n = _check_count("n_queries", n_queries)
    rng = np.random.Generator(np.random.PCG64(_check_seed(seed)))
    gaps = rng.exponential(1000.0 / rate, size=n)
    return _check_start(start_ms) + np.cumsum(gaps)


CV_RANGE = (1e-6, 1e3)  # the Gamma gaps' coefficient of variation: shape 1/cv^2 from 1e-6 to 1e12


def _check_cv(value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ConfigError("workload.cv", f"must be a number > 0 (coefficient of variation of the gaps; 1 = Poisson), "
                                         f"got {value!r}")
    if not math.isfinite(value) or not CV_RANGE[0] <= value <= CV_RANGE[1]:
        raise ConfigError("workload.cv", f"must be a number from {CV_RANGE[0]:g} to {CV_RANGE[1]:g} (1 = Poisson; the "
                                         f"Gamma shape 1 / cv^2 must stay a finite, non-zero number), got {value!r}")
    return float(value)


def gamma_arrivals(rate_qps: float, cv: float, n_queries: int, seed: int, start_ms: float = 0.0) -> np.ndarray:
    """Arrival times (ms) of ``n_queries`` queries with i.i.d. Gamma gaps (mean ``1000 / rate_qps``, CV ``cv``)."""
    rate = _check_rate("rate_qps", rate_qps)
    c = _check_cv(cv)
    n = _check_count("n_queries", n_queries)
    rng = np.random.Generator(np.random.PCG64(_check_seed(seed)))
    mean = 1000.0 / rate
    gaps = rng.gamma(1.0 / (c * c), mean * c * c, size=n)
    return _check_start(start_ms) + np.cumsum(gaps)


def uniform_arrivals(rate_qps: float, n_queries: int, start_ms: float = 0.0) -> np.ndarray:
    """Arrival times (ms): ``start_ms + i * 1000 / rate_qps`` for ``i = 0..n_queries-1``."""
    rate = _check_rate("rate_qps", rate_qps)
    n = _check_count("n_queries", n_queries)
    return _check_start(start_ms) + np.arange(n, dtype=np.float64) * (1000.0 / rate)


def stepping_rates(
    start_qps: float = 66.0, end_qps: float = 4000.0, step_queries: int = 2000, n_queries: int = 32000
) -> np.ndarray:
    """The offered rate (QPS) of every query of the stepping load (geometric levels, see module docstring)."""
    lo = _check_rate("start_qps", start_qps)
    hi = _check_rate("end_qps", end_qps)
    step = _check_count("step_queries", step_queries)
    n = _check_count("n_queries", n_queries)
    n_steps = -(-n // step)
    if n_steps == 1:
        levels = np.array([lo])
    else:
        levels = lo * (hi / lo) ** (np.arange(n_steps) / (n_steps - 1))
        levels[-1] = hi  # exact, free of rounding
    return levels[np.arange(n) // step]


def stepping_arrivals(
    start_qps: float = 66.0,
    end_qps: float = 4000.0,
    step_queries: int = 2000,
    n_queries: int = 32000,
    seed: int = 0,
    poisson: bool = True,
    start_ms: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """(arrival times in ms, offered rate in QPS per query) of the DVABatch stepping load."""
    rates = stepping_rates(start_qps, end_qps, step_queries, n_queries)
    return _arrivals_at_rates(rates, seed, poisson, start_ms), rates


def _arrivals_at_rates(rates: np.ndarray, seed: int, poisson: bool, start_ms: float) -> np.ndarray:
    """Arrival times (ms) where the gap *before* query ``i`` has mean ``1000 / rates[i]``: exponential
    (``poisson``, ``Generator(PCG64(seed))``) or constant; the first query arrives one gap after ``start_ms``."""
    if not isinstance(poisson, bool | np.bool_):
        raise ConfigError("workload.poisson", f"must be true or false, got {poisson!r}")
    mean_gaps = 1000.0 / rates
    if poisson:
        rng = np.random.Generator(np.random.PCG64(_check_seed(seed)))
        gaps = rng.exponential(1.0, size=len(rates)) * mean_gaps
    else:
        _check_seed(seed)
        gaps = mean_gaps
    return _check_start(start_ms) + np.cumsum(gaps)


def phases_rates(phases) -> np.ndarray:
    """The offered rate (QPS) of every query of a ``phases`` load: ``phases`` is a list of ``{n, rate_qps}``
    tables (``n`` queries at ``rate_qps``, one phase after the other)."""
    if isinstance(phases, (str, bytes, dict)) or not isinstance(phases, (list, tuple)) or not phases:
        raise ConfigError("workload.phases", 'must be a non-empty list of {n = ..., rate_qps = ...} tables, e.g. '
                                             '[{n = 150, rate_qps = 50}, {n = 250, rate_qps = 300}]')
    rates = []
    for i, ph in enumerate(phases):
        if not isinstance(ph, dict) or set(ph) != {"n", "rate_qps"}:
            raise ConfigError(f"workload.phases[{i}]", f"must be a table with exactly the keys n and rate_qps, "
                                                       f"got {ph!r}")
        n = _check_count(f"phases[{i}].n", ph["n"])
        rate = _check_rate(f"phases[{i}].rate_qps", ph["rate_qps"])
        rates.append(np.full(n, rate))
    out = np.concatenate(rates)
    _check_count("phases", int(out.size))  # their n in all
    return out


def phases_arrivals(phases, seed: int = 0, poisson: bool = True, start_ms: float = 0.0
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(arrival times in ms, offered rate in QPS per query) of a load in phases (E2bird's diurnal pattern, §8.2:
    ``[{n = 150, rate_qps = low}, {n = 250, rate_qps = high}]``). The gap *before* query ``i`` uses query ``i``'s
    phase rate, exponential (``poisson``, ``Generator(PCG64(seed))``) or constant ``1000 / rate``, as in
    :func:`stepping_arrivals`; the first query arrives one gap after ``start_ms``."""
    rates = phases_rates(phases)
    return _arrivals_at_rates(rates, seed, poisson, start_ms), rates
