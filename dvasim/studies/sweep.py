"""Sweeps: many runs of one base config with some keys changed, locally in parallel or on a Dask cluster.

A sweep file (TOML)::

    base = "configs/default.toml"        # the config every run starts from (relative to the sweep file)
    # optional: how many queries etc. for every run, as in --set
    set = ["workload.n_queries=2000"]

    [grid]                               # every combination (the product) of these values
    "policy.name" = ["zerobatch", "dvabatch"]
    "workload.rate_qps" = [50, 100, 150]
    # a bare section name replaces the whole section (a change of shape: another policy with its own
    # parameters, another workload kind)
    # "workload" = [{kind = "poisson", rate_qps = 100, n_queries = 2000}, {kind = "stepping", n_queries = 4000}]

    [random]                             # optional: n random draws, each combined with every grid point
    n = 8
    seed = 0
    "policy.max_queue_delay_ms" = {uniform = [0.0, 20.0]}   # also loguniform, randint = [lo, hi], choice = [...]

    [seeds]                              # optional: every point repeated with these workload seeds
    values = [0, 1, 2]                   # or n = 3 (seeds 0..n-1)

    [capacity]                           # optional: each point is a capacity search instead of one run
    slo_ms = 50                          # (dvasim.studies.capacity: percentile = 99, confidence, resolution, max_queries)

``dvasim sweep --stack NAME`` (``sweep(..., stack=NAME)``) runs every point on that serving stack (over the
configs' ``[server] stack``, as ``dvasim run --stack``); ``--engine ENGINE.toml`` (``engine=``) merges an engine file
from ``dvasim fit`` into the base config before its ``set`` and the swept values (as ``dvasim run --engine`` does
before ``--set``), so the file travels inside every point's config to any worker.

A dotted key ``section.key`` sets one key (``engine.host.key`` a key of ``[engine.host]``); a value ``"unset"``
given as ``{unset = true}`` removes the key. Runs are independent and deterministic, so a sweep's results do
not depend on where or in which order its runs ran: serially (``workers = 1``), in local processes (the
default, one per core) or on a Dask cluster (``dask = "tcp://HOST:PORT"``, or a ``distributed.Client``).

Every finished run is cached as ``DIR/runs/<hash>.json`` (the hash of its resolved config and dvasim's
version); a sweep run again skips what is cached, so an interrupted sweep resumes. The results are one tidy
table, one row per run (the swept values, then every scalar of the run's summary), written to
``DIR/results.csv`` and ``DIR/results.parquet``, and a latency-versus-load figure ``DIR/latency_vs_load.png``.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dvasim import config as cfgmod
from dvasim.errors import ConfigError
from dvasim.schema import Key, Section

SWEEP_RANDOM = Section("sweep.random", "random draws, each combined with every grid point", (
    Key("n", "int", "the number of draws", minimum=1),
    Key("seed", "int", "the draws' seed", default=0, minimum=0),
), open=True, open_help='dotted keys to distributions: {uniform = [lo, hi]}, {loguniform = [lo, hi]}, '
                        '{randint = [lo, hi]} or {choice = [...]}')
SWEEP_SEEDS = Section("sweep.seeds", "every point repeated with these workload seeds (give one of the two)", (
    Key("n", "int", "seeds 0..n-1", minimum=1),
    Key("values", "ints", "the seeds", minimum=0),
))
SWEEP_CAPACITY = Section("sweep.capacity", "each point a capacity search (dvasim capacity) instead of one run", (
    Key("slo_ms", "number", "the latency objective (ms); required", minimum=0, strict=True),
    Key("percentile", "number", "the percentile that must meet it", default=99.0, minimum=0, maximum=100,
        strict=True, strict_max=True),
    Key("confidence", "number", "confidence of each probe's verdict", default=0.95, minimum=0.5, maximum=1,
        strict_max=True),
    Key("resolution", "number", "relative width of the final bracket", default=0.02, minimum=0, maximum=1,
        strict=True, strict_max=True),
    Key("max_queries", "int", "most queries of one probe", default=64_000, minimum=1),
))
SWEEP = Section("sweep", "a sweep file (dvasim sweep): many runs of one base config with some keys changed", (
    Key("base", "path", "the config every run starts from (relative to the sweep file); required"),
    Key("set", "list", "overrides for every run, as --set (e.g. [\"workload.n_queries=2000\"])"),
    Key("grid", "table", "dotted keys to lists of values: every combination (the product) runs; a bare section "
        "name takes whole tables"),
    Key("random", "table", "random draws", section=SWEEP_RANDOM),
    Key("seeds", "table", "workload seeds", section=SWEEP_SEEDS),
    Key("capacity", "table", "a capacity search per point", section=SWEEP_CAPACITY),
))
SWEEP_SECTIONS = (SWEEP, SWEEP_RANDOM, SWEEP_SEEDS, SWEEP_CAPACITY)
SWEEP_KEYS = tuple(SWEEP.by_name)
CAPACITY_KEYS = tuple(SWEEP_CAPACITY.by_name)
DISTRIBUTIONS = ("uniform", "loguniform", "randint", "choice")


@dataclass(frozen=True)
class Point:
    """One run of a sweep: the swept values (dotted key -> value) and the full raw config."""

    values: dict[str, Any]
    config: dict[str, Any]
    key: str  # hash of the resolved config (and dvasim's version): the run's cache name


# ----------------------------------------------------------------------------- the sweep file
def load_sweep(path: str | Path) -> dict[str, Any]:
    try:
        data = cfgmod.load_toml(path)
    except ConfigError as e:
        raise ConfigError("sweep", e.message.replace("TOML config", "TOML sweep file")) from None
    base_dir = data.pop("_base_dir")
    if "base" not in data:
        raise ConfigError("sweep.base", 'missing; give the config every run starts from, e.g. base = "run.toml"')
    SWEEP.check(data)  # unknown keys, types and ranges ([random], [seeds] and [capacity] included)
    data["base"] = str(cfgmod.find_file(data["base"], base_dir, "sweep.base"))
    cap = data.get("capacity")
    if cap is not None and "slo_ms" not in cap:
        raise ConfigError("sweep.capacity.slo_ms", "missing; each point's capacity search needs its SLO, e.g. "
                                                   "slo_ms = 50 (and optionally percentile, confidence, resolution, "
                                                   "max_queries)")
    return data


def _set_dotted(raw: dict[str, Any], key: str, value: Any, field: str) -> None:
    parts = key.split(".")
    if parts[0] not in cfgmod.SECTIONS:
        raise ConfigError(field, f"{key!r}: unknown section [{parts[0]}]; allowed: {', '.join(cfgmod.SECTIONS)}")
    unset = isinstance(value, dict) and set(value) == {"unset"} and value["unset"] is True
    if len(parts) == 1:  # the whole section
        if unset:
            raw.pop(parts[0], None)
            return
        if not isinstance(value, dict):
            raise ConfigError(field, f"{key!r} names a whole section: its values must be tables, e.g. "
                                     f"{{kind = \"poisson\", rate_qps = 100}}; got {value!r}")
        raw[parts[0]] = copy.deepcopy(value)
        return
    node = raw.setdefault(parts[0], {})
    for p in parts[1:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(field, f"{key!r}: {p!r} is not a table")
        node = nxt
    if unset:
        node.pop(parts[-1], None)
    else:
        node[parts[-1]] = copy.deepcopy(value)


def _grid(spec: Any) -> list[dict[str, Any]]:
    if spec is None:
        return [{}]
    if not isinstance(spec, dict) or not spec:
        raise ConfigError("sweep.grid", 'must be a table of dotted keys to lists, e.g. "policy.name" = ["zerobatch"]')
    for k, v in spec.items():
        if not isinstance(v, list) or not v:
            raise ConfigError(f"sweep.grid.{k}", f"must be a non-empty list of values, got {v!r}")
    keys = list(spec)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(spec[k] for k in keys))]


def _draw(rng: np.random.Generator, key: str, dist: Any) -> Any:
    field = f"sweep.random.{key}"
    if not isinstance(dist, dict) or len(dist) != 1 or next(iter(dist)) not in DISTRIBUTIONS:
        raise ConfigError(field, f"must be one of {{uniform = [lo, hi]}}, {{loguniform = [lo, hi]}}, "
                                 f"{{randint = [lo, hi]}}, {{choice = [...]}}; got {dist!r}")
    kind, arg = next(iter(dist.items()))
    if kind == "choice":
        if not isinstance(arg, list) or not arg:
            raise ConfigError(field, f"choice needs a non-empty list, got {arg!r}")
        return copy.deepcopy(arg[int(rng.integers(len(arg)))])
    if (not isinstance(arg, list) or len(arg) != 2 or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                              and math.isfinite(x) for x in arg) or arg[0] > arg[1]):
        raise ConfigError(field, f"{kind} needs [lo, hi] with lo <= hi, got {arg!r}")
    lo, hi = arg
    if kind == "uniform":
        return float(rng.uniform(lo, hi))
    if kind == "loguniform":
        if lo <= 0:
            raise ConfigError(field, f"loguniform needs lo > 0, got {lo!r}")
        return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    if int(lo) != lo or int(hi) != hi:
        raise ConfigError(field, f"randint needs integer bounds, got {arg!r}")
    return int(rng.integers(int(lo), int(hi) + 1))


def _random(spec: Any) -> list[dict[str, Any]]:
    if spec is None:
        return [{}]
    if not isinstance(spec, dict):
        raise ConfigError("sweep.random", "must be a table: n = 8, seed = 0, and dotted keys to distributions")
    SWEEP_RANDOM.check(spec)
    if "n" not in spec:
        raise ConfigError("sweep.random.n", "missing; the number of draws, an integer >= 1")
    n, seed = spec["n"], spec.get("seed", SWEEP_RANDOM.default("seed"))
    dists = {k: v for k, v in spec.items() if k not in ("n", "seed")}
    if not dists:
        raise ConfigError("sweep.random", 'give at least one dotted key, e.g. "workload.rate_qps" = {uniform = [50, 150]}')
    rng = np.random.default_rng(seed)
    return [{k: _draw(rng, k, d) for k, d in dists.items()} for _ in range(n)]


def _seeds(spec: Any) -> list[int] | None:
    if spec is None:
        return None
    if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in ("n", "values"):
        raise ConfigError("sweep.seeds", "must be a table with either n = 3 or values = [0, 1, 2]")
    SWEEP_SEEDS.check(spec)
    if "n" in spec:
        return list(range(spec["n"]))
    if not spec["values"]:
        raise ConfigError("sweep.seeds.values", "must be a non-empty list of integers >= 0, got []")
    return list(spec["values"])


def run_key(config: dict[str, Any]) -> str:
    """The cache name of a run: a hash of its resolved config (defaults filled in, paths made absolute) and of
    dvasim's version. Checks the config (a bad point fails before any run)."""
    from dvasim.api import versions
    from dvasim.policies import make_policy

    resolved = cfgmod.resolve(config)
    make_policy(resolved["policy"]["name"], {k: v for k, v in resolved["policy"].items() if k != "name"})
    resolved.pop("base_dir", None)
    blob = json.dumps({"config": resolved, "dvasim": versions().get("dvasim", "")}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def expand(sweep: dict[str, Any], *, stack: str | None = None, engine: str | Path | None = None) -> list[Point]:
    """Every run of a loaded sweep, in a fixed order: grid points, each with every random draw, each with every
    seed. ``engine``: an engine file merged into the base config first; ``stack``: the stack every point runs on
    (part of each point's cache key)."""
    base = cfgmod.apply_engine_file(cfgmod.load_toml(sweep["base"]), None if engine is None else str(engine))
    base = cfgmod.apply_overrides(base, _set_list(sweep.get("set")))
    points = []
    seeds = _seeds(sweep.get("seeds"))
    for g in _grid(sweep.get("grid")):
        for r in _random(sweep.get("random")):
            for s in seeds if seeds is not None else [None]:
                values = {**g, **r}
                if s is not None:
                    values["workload.seed"] = s
                raw = copy.deepcopy(base)
                for k, v in values.items():
                    _set_dotted(raw, k, v, f"sweep.grid.{k}")
                key = run_key(raw) if sweep.get("capacity") is None else hashlib.sha256(
                    (run_key(raw) + json.dumps(sweep["capacity"], sort_keys=True)).encode()).hexdigest()[:20]
                if stack is not None:
                    key = hashlib.sha256(f"{key} stack={stack}".encode()).hexdigest()[:20]
                points.append(Point(values, raw, key))
    return points


def _set_list(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise ConfigError("sweep.set", f'must be a list of "section.key=value" strings, got {value!r}')
    return value


# ----------------------------------------------------------------------------- running
def run_point(config: dict[str, Any], capacity: dict[str, Any] | None = None,
              stack: str | None = None) -> dict[str, Any]:
    """One run (in any process): its summary's scalars and its wall time; with ``capacity`` (the sweep's
    ``[capacity]`` table), the capacity search's result instead (``capacity_qps``, its bracket and probes).
    ``stack``: the serving stack's name (a plain string, so it travels to any worker)."""
    import warnings

    from dvasim.api import run
    from dvasim.errors import IncompleteRunWarning

    t0 = time.perf_counter()
    if capacity is not None:
        from dvasim.studies.capacity import capacity as find_capacity

        cap = dict(capacity)
        res = find_capacity(config, cap.pop("slo_ms"), stack=stack, **cap)
        out = {k: v for k, v in res.items() if isinstance(v, (int, float, str, bool)) or v is None}
        out["bracket_lo_qps"], out["bracket_hi_qps"] = res["bracket_qps"]
        out["stuck"] = ""
        out["run_wall_s"] = time.perf_counter() - t0
        return out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IncompleteRunWarning)
        res = run(config, progress=False, stack=stack)
    out = {k: v for k, v in res.summary.items() if isinstance(v, (int, float, str, bool)) or v is None}
    out["stuck"] = res.stuck or ""
    out["run_wall_s"] = time.perf_counter() - t0
    return out


def _cached(runs_dir: Path, key: str) -> dict[str, Any] | None:
    p = runs_dir / f"{key}.json"
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text())["summary"]
    except (json.JSONDecodeError, KeyError):  # a run interrupted while writing: run it again
        return None


def sweep(path: str | Path, out_dir: str | Path, *, workers: int | None = None, dask: Any = None,
          progress: bool = True, figure: bool = True,
          on_result: Callable[[Point, dict], None] | None = None, stack: str | None = None,
          engine: str | Path | None = None) -> pd.DataFrame:
    """Run the sweep file ``path`` into ``out_dir`` (see the module docstring); returns the results table.

    ``workers``: local processes (default: one per core; 1 = in this process). ``dask``: a scheduler address
    (``"tcp://HOST:PORT"``) or a ``distributed.Client``: the runs go to that cluster instead. ``stack``: the
    serving stack of every run, by name; ``engine``: an engine file (``dvasim fit``) for every run."""
    if stack is not None:
        from dvasim.server.resolve import stack_by_name

        stack_by_name(stack, "--stack")
    spec = load_sweep(path)
    points = expand(spec, stack=stack, engine=engine)
    out = Path(out_dir)
    runs_dir = out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    todo = []
    for p in points:
        got = _cached(runs_dir, p.key)
        if got is not None:
            results[p.key] = got
        elif p.key not in {q.key for q in todo}:
            todo.append(p)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(points), initial=len(points) - len(todo), unit="run", desc="sweep", disable=None)

    def done(p: Point, summary: dict) -> None:
        results[p.key] = summary
        tmp = runs_dir / f"{p.key}.json.tmp"
        tmp.write_text(json.dumps({"values": p.values, "config": p.config, "summary": summary}, indent=1,
                                  default=str) + "\n")
        tmp.replace(runs_dir / f"{p.key}.json")
        if on_result is not None:
            on_result(p, summary)
        if bar is not None:
            bar.update(1)

    try:
        _execute(todo, done, workers, dask, spec.get("capacity"), stack)
    finally:
        if bar is not None:
            bar.close()
    table = results_table(points, results)
    table.to_csv(out / "results.csv", index=False)
    table.to_parquet(out / "results.parquet", index=False)
    if figure and len(table):
        from dvasim.reporting.plots import capacity_figure, sweep_figure

        if spec.get("capacity") is not None:
            capacity_figure(table, out / "capacity.png", slo_ms=spec["capacity"]["slo_ms"])
        else:
            sweep_figure(table, out / "latency_vs_load.png")
    return table


def _execute(todo: list[Point], done: Callable[[Point, dict], None], workers: int | None, dask: Any,
             capacity: dict | None = None, stack: str | None = None) -> None:
    if not todo:
        return
    if dask is not None:
        from distributed import Client, as_completed

        client = dask if isinstance(dask, Client) else Client(dask)
        try:
            futures = {client.submit(run_point, p.config, capacity, stack, key=f"dvasim-run-{p.key}", pure=False): p
                       for p in todo}
            for fut in as_completed(futures):
                done(futures[fut], fut.result())
        finally:
            if client is not dask:
                client.close()
        return
    workers = workers or os.cpu_count() or 1
    if workers <= 1 or len(todo) == 1:
        for p in todo:
            done(p, run_point(p.config, capacity, stack))
        return
    with ProcessPoolExecutor(max_workers=min(workers, len(todo))) as pool:
        futures = {pool.submit(run_point, p.config, capacity, stack): p for p in todo}
        from concurrent.futures import as_completed as cf_completed

        for fut in cf_completed(futures):
            done(futures[fut], fut.result())


def _swept_keys(points: Iterable[Point]) -> list[str]:
    keys: dict[str, None] = {}
    for p in points:
        keys.update(dict.fromkeys(p.values))
    return list(keys)


def column_name(key: str) -> str:
    """The results column of a swept key: the dotted key itself, ``[section]`` for a whole section."""
    return f"[{key}]" if "." not in key else key


def label(v: Any, keep: Iterable[str] | None = None) -> str:
    """A short label of a swept value: a section's ``name`` (or ``kind``) and its other keys (those in ``keep``,
    when given: the ones that differ between the sweep's values of that section)."""
    if isinstance(v, dict):
        head = v.get("name", v.get("kind"))
        rest = ", ".join(f"{k}={label(x)}" for k, x in v.items()
                         if k not in ("name", "kind") and (keep is None or k in keep))
        return f"{head} ({rest})" if head is not None and rest else str(head) if head is not None else rest
    if isinstance(v, list):
        return "[" + ", ".join(label(x) for x in v) + "]"
    return str(v)


def _cell(v: Any) -> Any:
    return json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v


WALL_COLUMNS = ("run_wall_s", "sim_wall_s", "sim_queries_per_wall_s")  # the only columns that vary between reruns


def results_table(points: list[Point], results: dict[str, dict]) -> pd.DataFrame:
    """One row per run, in the sweep's order: the swept values (a whole section as JSON), a short ``label`` of
    them, the run's hash, then its summary's scalars."""
    keys = _swept_keys(points)
    # for a swept section, the keys whose values differ between its variants (the others go without saying)
    varying: dict[str, set] = {}
    for k in keys:
        tables = [p.values[k] for p in points if isinstance(p.values.get(k), dict)]
        names = {n for t in tables for n in t}
        varying[k] = {n for n in names if len({json.dumps(t.get(n), sort_keys=True) for t in tables}) > 1}
    rows = []
    for p in points:
        row = {column_name(k): _cell(p.values.get(k)) for k in keys}
        row["label"] = ", ".join(label(p.values[k], varying[k]) for k in keys
                                 if k in p.values and k not in ("workload.seed", "workload.rate_qps"))
        row["run"] = p.key
        row.update({k: v for k, v in results[p.key].items() if k not in row})
        rows.append(row)
    return pd.DataFrame(rows)
