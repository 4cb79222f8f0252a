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
before ``--set``), so the file travels inside every point's config to any worker. ``--set section.key=value``
(``overrides=``) is applied to every point after the file's ``set``, like it; a key the sweep varies cannot be
``--set`` (the swept values would overwrite it).

**The stack is held across devices.** Each device implies its own stack (:mod:`dvasim.server.resolve`: the H100's
tables ``cudagraph``, the A100's ``triton-tensorrt``), so a sweep over ``model.device`` would change two things at
once. A sweep whose points differ in their device runs every point that names no stack of its own on the base
config's stack (:func:`hold_stack`), and says so; ``--stack-follows-device`` (``stack_follows_device=True``) lets
each device imply its own, and a point that sets ``server.stack`` (or ``[engine.host]``) keeps it. Every run's
stack and why are its results' ``stack`` and ``stack_source`` columns; ``dvasim sweep`` prints them
(:func:`stack_lines`) after its results table.

A dotted key ``section.key`` sets one key (``engine.host.key`` a key of ``[engine.host]``); a value ``"unset"``
given as ``{unset = true}`` removes the key. Runs are independent and deterministic, so a sweep's results do
not depend on where or in which order its runs ran: serially (``workers = 1``), in local processes (the
default, one per core) or on a Dask cluster (``dask = "tcp://HOST:PORT"``, or a ``distributed.Client``).

**Checked before any run.** The sweep file (unknown keys, types, ranges), then every point: resolved and built as
:func:`dvasim.run` builds it (model, stack, policy, workload, pipeline) without running it, a capacity point as
its probes would be. A bad point is one line naming the field and the point. **Limits**: at most
:data:`MAX_POINTS` (100,000) runs in a sweep, :func:`max_workers` local processes (:data:`MAX_WORKERS_PER_CORE`
per core, never more than :data:`MAX_WORKERS`), seeds up to 2**63 - 1, a Dask scheduler that answers within
:data:`dvasim.studies.parallel.DASK_CONNECT_TIMEOUT_S` seconds, and a ``[capacity]`` within :data:`dvasim.studies.capacity.OPTIONS`'
ranges (resolution >= 1e-4, at most 20 million queries a probe).

Every finished run is cached as ``DIR/runs/<hash>.json`` (the hash of its resolved config and dvasim's
version); a sweep run again skips what is cached, so an interrupted sweep resumes, and sweeps on one ``DIR``
share its cache (at the same time too). The results are one tidy table, one row per run (the swept values, then
every scalar of the run's summary), written to ``DIR/results.csv`` and ``DIR/results.parquet``, and a figure:
for runs, the mean and p99 latency against the swept key (:func:`figure_key`: the load when it varies,
``DIR/latency_vs_load.png``; else the first swept key with more than one value, ``DIR/latency_vs_<key>.png``);
for capacity searches, each point's capacity, ``DIR/capacity.png``. Every file (cache, results, figure) is
written under a temporary name of its own and renamed when complete (:func:`dvasim.outputs.write_whole`; results.csv and
results.parquet together), so sweeps on one ``DIR`` at the same time never tear each other's files. The
files a sweep wrote are listed in its table's ``attrs["files"]``; :func:`overview` is the short table
``dvasim sweep`` prints (the swept keys, the main metrics and a flag for unstable, SLO-missing and unfinished
runs).

**perf_analyzer's table** (``export="perf-analyzer"``, ``dvasim sweep --export perf-analyzer``): a sweep that
varies exactly one load, ``workload.rate_qps`` of an open loop (request-rate mode) or ``workload.clients`` of a
closed loop (concurrency mode), and nothing else (no ``[seeds]``, no ``[capacity]``), also writes the CSV that
``perf_analyzer -f`` writes (:mod:`dvasim.reporting.perf_analyzer`: its columns, units and row order), to
``export_out`` (default ``DIR/perf_analyzer.csv``). :func:`export_mode` checks the sweep before any run. Each
run's worker computes its row from its records (:func:`run_point`'s ``perf_analyzer``: a small dict, kept in the
run's cache under ``"perf_analyzer"``, out of the results table); a cached run without one runs again.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import os
import re
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dvasim import config as cfgmod
from dvasim.errors import ConfigError, DvasimError, UsageError
from dvasim.outputs import output_error, write_whole
from dvasim.progress import progress_bar
from dvasim.schema import Key, Section
from dvasim.studies.capacity import OPTIONS as CAPACITY_OPTIONS
from dvasim.studies.capacity import check_buildable, check_options, check_probe_config
from dvasim.studies.parallel import DASK_CONNECT_TIMEOUT_S, connect  # noqa: F401  (re-exported)
from dvasim.workload.config import MAX_SEED

MAX_POINTS = 100_000  # runs in one sweep: its table, its cache and its figure stay workable
MAX_WORKERS_PER_CORE = 4  # local processes: more only compete for the cores (and each holds a run in memory)
MAX_WORKERS = 256

SWEEP_RANDOM = Section("sweep.random", "random draws, each combined with every grid point", (
    Key("n", "int", "the number of draws", minimum=1, maximum=MAX_POINTS),
    Key("seed", "int", "the draws' seed", default=0, minimum=0, maximum=MAX_SEED),
), open=True, open_help='dotted keys to distributions: {uniform = [lo, hi]}, {loguniform = [lo, hi]}, '
                        '{randint = [lo, hi]} or {choice = [...]}')
SWEEP_SEEDS = Section("sweep.seeds", "every point repeated with these workload seeds (give one of the two)", (
    Key("n", "int", "seeds 0..n-1", minimum=1, maximum=MAX_POINTS),
    Key("values", "ints", "the seeds (at most 2**63 - 1)", minimum=0),  # the top checked exactly by _seeds
))
SWEEP_CAPACITY = Section("sweep.capacity", "each point a capacity search (dvasim capacity) instead of one run",
                         tuple(CAPACITY_OPTIONS[k] for k in ("slo_ms", "percentile", "confidence", "resolution",
                                                             "max_queries", "min_duration_s", "trigger",
                                                             "trigger_slos", "confirm_factor")))
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
DISTRIBUTIONS = ("uniform", "loguniform", "randint", "choice")


@dataclass(frozen=True)
class Point:
    """One run of a sweep: the swept values (dotted key -> value) and the full raw config."""

    values: dict[str, Any]
    config: dict[str, Any]
    key: str  # hash of the resolved config (and dvasim's version): the run's cache name
    stack_note: str = ""  # why the point's stack was held (:func:`hold_stack`), its results' stack_source


# ----------------------------------------------------------------------------- the sweep file
def load_sweep(path: str | Path) -> dict[str, Any]:
    """A sweep file read and checked: its keys, types and ranges, its ``[capacity]`` settings and its size (at
    most :data:`MAX_POINTS` runs), before anything is expanded."""
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
    if cap is not None:
        if "slo_ms" not in cap:
            raise ConfigError("sweep.capacity.slo_ms", "missing; each point's capacity search needs its SLO, e.g. "
                                                       "slo_ms = 50 (and optionally percentile, confidence, "
                                                       "resolution, max_queries)")
        check_options(cap, where="sweep.capacity")  # max_queries against the first probe's queries
    sweep_size(data)
    return data


def sweep_size(spec: dict[str, Any]) -> int:
    """The number of runs of a loaded sweep (grid points x random draws x seeds), counted without expanding it;
    more than :data:`MAX_POINTS` is a :class:`ConfigError`."""
    grid = _grid_spec(spec.get("grid"))
    sizes = {"grid points": math.prod(len(v) for v in grid.values())}
    rnd = spec.get("random")
    if isinstance(rnd, dict) and isinstance(rnd.get("n"), int):
        sizes["random draws"] = rnd["n"]
    seeds = spec.get("seeds")
    if isinstance(seeds, dict):
        sizes["seeds"] = seeds["n"] if isinstance(seeds.get("n"), int) else len(seeds.get("values") or [])
    total = math.prod(sizes.values())
    if total > MAX_POINTS:
        parts = " x ".join(f"{v:,} {k}" for k, v in sizes.items())
        raise ConfigError("sweep", f"{total:,} runs ({parts}); at most {MAX_POINTS:,} in one sweep: split it into "
                                   "several sweep files (each with its own --out), or sample with [random]")
    return total


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


def _grid_spec(spec: Any) -> dict[str, list]:
    """The ``[grid]`` checked: dotted keys to non-empty lists."""
    if spec is None:
        return {}
    if not isinstance(spec, dict) or not spec:
        raise ConfigError("sweep.grid", 'must be a table of dotted keys to lists, e.g. "policy.name" = ["zerobatch"]')
    for k, v in spec.items():
        if not isinstance(v, list) or not v:
            raise ConfigError(f"sweep.grid.{k}", f"must be a non-empty list of values, got {v!r}")
    return spec


def _grid(spec: Any) -> list[dict[str, Any]]:
    grid = _grid_spec(spec)
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


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
    if max(spec["values"]) > MAX_SEED:
        raise ConfigError("sweep.seeds.values", f"seeds are integers in 0..{MAX_SEED} (2**63 - 1), got "
                                                f"{max(spec['values'])}")
    return list(spec["values"])


def run_key(config: dict[str, Any], version: str | None = None) -> str:
    """The cache name of a run: a hash of its resolved config (defaults filled in, paths made absolute) and of
    dvasim's version (``version``: given when known, else looked up). Checks the config and its policy (a bad
    point fails before any run)."""
    from dvasim.api import versions
    from dvasim.policies import make_policy

    resolved = cfgmod.resolve(config)
    make_policy(resolved["policy"]["name"], {k: v for k, v in resolved["policy"].items() if k != "name"})
    resolved.pop("base_dir", None)
    version = versions().get("dvasim", "") if version is None else version
    blob = json.dumps({"config": resolved, "dvasim": version}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def expand(sweep: dict[str, Any], *, stack: str | None = None, engine: str | Path | None = None,
           overrides: list[str] | None = None, stack_follows_device: bool = False) -> list[Point]:
    """Every run of a loaded sweep, in a fixed order: grid points, each with every random draw, each with every
    seed; each point's config resolved and its policy made (:func:`check_points` builds the rest). ``engine``: an
    engine file merged into the base config first; ``overrides``: ``--set`` overrides after the file's ``set``;
    ``stack``: the stack every point runs on (part of each point's cache key). A sweep that varies the device
    holds the stack (:func:`hold_stack`) unless ``stack_follows_device``."""
    from dvasim.api import versions

    n = sweep_size(sweep)
    base = cfgmod.apply_engine_file(cfgmod.load_toml(sweep["base"]), None if engine is None else str(engine))
    base = cfgmod.apply_overrides(base, _set_list(sweep.get("set")))
    seeds = _seeds(sweep.get("seeds"))
    grid, draws = _grid(sweep.get("grid")), _random(sweep.get("random"))
    keys = list(dict.fromkeys([*grid[0], *draws[0], *(["workload.seed"] if seeds is not None else [])]))
    base = cfgmod.apply_overrides(base, check_overrides(overrides, keys))
    version = versions().get("dvasim", "")
    raws = []
    for g, r, s in itertools.product(grid, draws, seeds if seeds is not None else [None]):
        values = {**g, **r}
        if s is not None:
            values["workload.seed"] = s
        raw = copy.deepcopy(base)
        for k, v in values.items():
            _set_dotted(raw, k, v, f"sweep.grid.{k}")
        raws.append((values, raw))
    notes = [""] * len(raws) if stack is not None or stack_follows_device else hold_stack(raws, base)
    points = []
    for (values, raw), note in zip(raws, notes):
        try:
            key = run_key(raw, version)
        except DvasimError as e:
            raise in_point(e, values, len(points), n) from None
        if sweep.get("capacity") is not None:
            key = hashlib.sha256((key + json.dumps(sweep["capacity"], sort_keys=True)).encode()).hexdigest()[:20]
        if stack is not None:
            key = hashlib.sha256(f"{key} stack={stack}".encode()).hexdigest()[:20]
        points.append(Point(values, raw, key, note))
    return points


# ----------------------------------------------------------------------------- the stack of a sweep's points
def _device(raw: dict[str, Any]) -> str | None:
    """The device of a raw config's named model (its default when unnamed in the config), ``None`` for a table."""
    from dvasim.model.catalog import MODEL

    model = raw.get("model")
    if not isinstance(model, dict) or "table" in model or "name" not in model:
        return None
    return model.get("device", MODEL.default("device"))


def _own_stack(raw: dict[str, Any]) -> bool:
    """The raw config names its stack (``[server] stack``) or its host (``[engine.host]``: the stack ``custom``)."""
    server, engine = raw.get("server"), raw.get("engine")
    return ((isinstance(server, dict) and "stack" in server)
            or (isinstance(engine, dict) and bool(engine.get("host"))))


def hold_stack(raws: list[tuple[dict[str, Any], dict[str, Any]]], base: dict[str, Any]) -> list[str]:
    """A sweep whose points differ in their device holds the stack fixed: every point whose stack its device would
    imply (no ``[server] stack``, no ``[engine.host]`` of its own) gets the base config's stack
    (:func:`config_stack`; the first such point's when the base does not resolve alone) as ``[server] stack``,
    so that one comparison changes one thing. ``raws``: ``(swept values, raw config)`` of every point, changed in
    place. Returns each point's note (its results' ``stack_source``; ``""`` where nothing was held).
    ``dvasim sweep --stack-follows-device`` (``sweep(..., stack_follows_device=True)``) skips this."""
    notes = [""] * len(raws)
    if not any(k == "model" or k.startswith("model.") for values, _ in raws[:1] for k in values):
        return notes  # the device is the base config's at every point
    devices = {_device(raw) for _, raw in raws}
    implied = [i for i, (_, raw) in enumerate(raws) if not _own_stack(raw)]
    if len(devices) < 2 or not implied:
        return notes
    try:
        name, reason = config_stack(base, name_only=True)
    except DvasimError:  # the base alone is no config (the grid completes it): the first implied point's stack
        try:
            name, reason = config_stack(raws[implied[0]][1], name_only=True)
        except DvasimError:
            return notes  # the point's own error comes when its key is made
    note = f"held across devices: the base config's, {reason}"
    for i in implied:
        raw = raws[i][1]
        raw["server"] = {**(raw.get("server") if isinstance(raw.get("server"), dict) else {}), "stack": name}
        notes[i] = note
    return notes


def config_stack(config: Any, overrides: list[str] | None = None, *, stack: str | None = None,
                 engine: str | Path | None = None, name_only: bool = False) -> tuple[str, str]:
    """The serving stack a config runs on, as :func:`dvasim.run` resolves it (without running it), and why:
    ``(label, reason)``, e.g. ``("cudagraph", "implied by device h100")``
    (:func:`dvasim.server.resolve.stack_reason`); ``name_only``: the stack's name rather than its label (which
    names a Triton release the config sets). A config that does not resolve raises its :class:`ConfigError`."""
    from dvasim.model.catalog import resolve_model
    from dvasim.server.resolve import resolve_stack

    cfg = cfgmod.resolve(copy.deepcopy(config) if isinstance(config, dict) else config, overrides, engine=engine)
    served = resolve_stack(cfg, resolve_model(cfg["model"]), stack=stack)
    return (served.stack.name if name_only else served.label), served.reason


def stack_lines(points: list[Point], stack: str | None = None, follows_device: bool = False) -> list[str]:
    """What ``dvasim sweep`` prints about its stacks (after its results): ``stack: NAME (REASON)`` when every
    point runs on one, else one line per stack with its points; and, where the sweep varies the device, whether
    the stack was held (:func:`hold_stack`) or follows it (``--stack-follows-device``)."""
    from dvasim.server.resolve import stack_line

    if stack is not None:
        return [stack_line(stack, "set by --stack, at every point")]
    seen: dict[str, tuple[str, str]] = {}
    count: dict[tuple[str, str], int] = {}
    for p in points:
        sections = json.dumps({k: p.config.get(k) for k in ("model", "engine", "server")}, sort_keys=True,
                              default=str)
        if sections not in seen:
            try:
                seen[sections] = config_stack(p.config)
            except DvasimError:
                seen[sections] = ("?", "does not resolve")
        label_, reason = seen[sections]
        if p.stack_note:
            reason = p.stack_note
        count[(label_, reason)] = count.get((label_, reason), 0) + 1
    if len(count) == 1:
        (label_, reason), = count
        lines = [stack_line(label_, reason)]
    else:
        lines = ["stacks (they differ between points: column stack of results.csv):"]
        lines += [f"  {label_} ({reason}): {n} of {len(points)} points" for (label_, reason), n in count.items()]
    devices = {_device(p.config) for p in points}
    if len(devices) > 1:
        if any(p.stack_note for p in points):
            lines.append("the sweep varies the device and holds the stack, so that only the device changes; "
                         "--stack-follows-device lets each device imply its own (a point's own server.stack always "
                         "wins)")
        elif follows_device:
            lines.append("the sweep varies the device and the stack follows it (--stack-follows-device): a "
                         "difference between devices is a difference between stacks too")
    return lines


def check_overrides(overrides: list[str] | None, swept: Iterable[str]) -> list[str]:
    """``--set`` overrides for every point: each must leave the swept keys alone (the swept values would overwrite
    it); returned as a list."""
    overrides = list(overrides or [])
    if not all(isinstance(o, str) for o in overrides):
        raise UsageError("--set", f'must be "section.key=value" strings, got {overrides!r}')
    for text in overrides:
        section, key, _ = cfgmod.parse_override(text)
        dotted = section if key is None else f"{section}.{key}"
        for k in swept:
            if k == dotted or dotted.startswith(k + "."):
                raise UsageError("--set", f"{text!r}: the sweep varies {k!r}, which would overwrite it at every "
                                          "point; change the sweep file's grid, [random] or [seeds] instead")
    return overrides


def in_point(e: DvasimError, values: dict[str, Any], i: int, n: int) -> DvasimError:
    """The error ``e`` (same class and field) saying which point of the sweep (``i`` of ``n``) it is about."""
    where = ", ".join(f"{k}={label(v)}" for k, v in values.items()) or "the base config"
    return type(e)(e.field, f"{e.message} (sweep point {i + 1} of {n}: {where})")


def _set_list(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise ConfigError("sweep.set", f'must be a list of "section.key=value" strings, got {value!r}')
    return value


def check_points(points: list[Point], *, stack: str | None = None, capacity: dict[str, Any] | None = None,
                 skip: Iterable[str] = (), progress: bool = False) -> None:
    """Every point (but those whose key is in ``skip``: cached runs, which ran before) built as its run would
    build it (:func:`dvasim.studies.capacity.check_buildable`; a capacity point as its probes would,
    :func:`~dvasim.studies.capacity.check_probe_config`), without running anything: a bad point is its run's own
    one-line error, saying which point it is. Points that differ only in their workload seed are built once (the
    others' seeds checked against ``[workload] seed``'s range)."""
    from dvasim.workload.config import WORKLOAD

    n0 = None if capacity is None else check_options(capacity, where="sweep.capacity")
    most = None if capacity is None else capacity.get("max_queries")
    skip, built = set(skip), set()
    bar = progress_bar(len(points), enabled=progress and len(points) > 1, unit="point", desc="checking",
                       leave=False)
    with bar:
        for i, p in enumerate(points):
            bar.update(1)
            if p.key in skip:
                continue
            try:
                if capacity is not None:
                    check_probe_config(p.config, stack, 1.0, n0, most)
                    continue
                wl = p.config.get("workload")
                seedless = json.dumps({**p.config, "workload": {k: v for k, v in wl.items() if k != "seed"}}
                                      if isinstance(wl, dict) else p.config, sort_keys=True, default=str)
                if seedless in built:
                    WORKLOAD["seed"].check("workload", wl.get("seed", 0))
                    continue
                check_buildable(p.config, stack)
                built.add(seedless)
            except DvasimError as e:
                raise in_point(e, p.values, i, len(points)) from None


# ----------------------------------------------------------------------------- running
def run_point(config: dict[str, Any], capacity: dict[str, Any] | None = None,
              stack: str | None = None, perf_analyzer: bool = False) -> dict[str, Any]:
    """One run (in any process): its summary's scalars and its wall time; with ``capacity`` (the sweep's
    ``[capacity]`` table), the capacity search's result instead (``capacity_qps``, its bracket and probes).
    ``stack``: the serving stack's name (a plain string, so it travels to any worker). ``perf_analyzer``: also
    the run's row of perf_analyzer's table (:func:`dvasim.reporting.perf_analyzer.point_columns`, computed here
    from the records, which stay in the worker), under ``"perf_analyzer"``."""
    import warnings

    from dvasim.api import run_whole as run
    from dvasim.errors import IncompleteRunWarning

    t0 = time.perf_counter()
    if capacity is not None:
        from dvasim.studies.capacity import capacity as find_capacity

        cap = dict(capacity)
        res = find_capacity(config, cap.pop("slo_ms"), stack=stack, workers=1, **cap)
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
    if perf_analyzer:
        from dvasim.reporting.perf_analyzer import run_columns

        out["perf_analyzer"] = run_columns(res, config, stack)
    out["run_wall_s"] = time.perf_counter() - t0
    return out


def _cached(runs_dir: Path, key: str) -> dict[str, Any] | None:
    p = runs_dir / f"{key}.json"
    if not p.is_file():
        return None
    try:
        summary = json.loads(p.read_text())["summary"]
    except (json.JSONDecodeError, KeyError, TypeError, OSError, UnicodeDecodeError):  # unreadable: run it again
        return None
    # what run_point returns (a table of scalars, its wall time among them), or a damaged entry: run it again
    ok = isinstance(summary, dict) and "run_wall_s" in summary and all(
        isinstance(v, int | float | str | bool) or v is None or k == "perf_analyzer" for k, v in summary.items())
    # the file is strict JSON (_save_run): a figure that was not a number is null there, and NaN again here
    return {k: math.nan if v is None else v for k, v in summary.items()} if ok else None


def max_workers() -> int:
    """The most local processes a sweep takes: :data:`MAX_WORKERS_PER_CORE` per core, at most
    :data:`MAX_WORKERS`."""
    return max(1, min(MAX_WORKERS, MAX_WORKERS_PER_CORE * (os.cpu_count() or 1)))


def check_workers(workers: Any) -> int | None:
    """``workers`` (None: one per core) checked against :func:`max_workers`: a :class:`UsageError` on
    ``--workers``."""
    if workers is None:
        return None
    most = max_workers()
    if isinstance(workers, bool) or not isinstance(workers, int | np.integer) or not 1 <= workers <= most:
        raise UsageError("--workers", f"must be an integer in 1..{most} ({MAX_WORKERS_PER_CORE} per core of this "
                                      f"machine's {os.cpu_count() or 1}, at most {MAX_WORKERS}; 1 = serial), got "
                                      f"{workers!r}")
    return int(workers)


def _save_run(runs_dir: Path, p: Point, summary: dict) -> None:
    """A run's cache file, written whole (:func:`dvasim.outputs.write_whole`), strict JSON: in the summary a figure
    that is not a number (a stability figure of a short run, say) is null; in the config an infinite value (a free
    copy, ``h2d_gbps = inf``) is the string ``"inf"``, as the run's config.json has it."""
    from dvasim.reporting.result import strict_json

    def spelled(o: Any) -> Any:
        if isinstance(o, float) and not math.isfinite(o):
            return str(o)
        if isinstance(o, dict):
            return {k: spelled(v) for k, v in o.items()}
        return [spelled(v) for v in o] if isinstance(o, list | tuple) else o

    text = json.dumps({"values": spelled(p.values), "config": spelled(p.config), "summary": strict_json(summary)},
                      indent=1, default=str, allow_nan=False) + "\n"
    write_whole({runs_dir / f"{p.key}.json": lambda tmp: tmp.write_text(text, encoding="utf-8")})


def sweep(path: str | Path, out_dir: str | Path, *, workers: int | None = None, dask: Any = None,
          progress: bool = True, figure: bool = True,
          on_result: Callable[[Point, dict], None] | None = None, stack: str | None = None,
          engine: str | Path | None = None, overrides: list[str] | None = None, export: str | None = None,
          export_out: str | Path | None = None, verbose_csv: bool = False, stack_follows_device: bool = False,
          notify: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Run the sweep file ``path`` into ``out_dir`` (see the module docstring); returns the results table, the
    files written in its ``attrs["files"]``.

    ``workers``: local processes (default: one per core; 1 = in this process; at most :func:`max_workers`).
    ``dask``: a scheduler address (``"tcp://HOST:PORT"``) or a ``distributed.Client``: the runs go to that cluster
    instead. ``stack``: the serving stack of every run, by name; ``engine``: an engine file (``dvasim fit``) for
    every run; ``overrides``: ``--set`` overrides for every run. ``progress``: bars on a terminal only.
    ``export = "perf-analyzer"``: also perf_analyzer's CSV, to ``export_out`` (default ``DIR/perf_analyzer.csv``;
    ``verbose_csv``: with its ``--verbose-csv`` columns), named in ``attrs["perf_analyzer_csv"]``;
    ``attrs["perf_analyzer_left_out"]`` counts the runs that finished no query (no row). Everything is checked (every point built) before the first run.
    A sweep that varies the device holds the stack at the base config's (:func:`hold_stack`) unless
    ``stack_follows_device``; what each point runs on, and why, is said in ``attrs["stack_lines"]`` (given to
    ``notify``, e.g. ``print``, before the first run) and in the results' ``stack`` and ``stack_source``."""
    workers = check_workers(workers)
    if stack is not None:
        from dvasim.server.resolve import stack_by_name

        stack_by_name(stack, "--stack")
    spec = load_sweep(path)
    points = expand(spec, stack=stack, engine=engine, overrides=overrides, stack_follows_device=stack_follows_device)
    out = Path(out_dir)
    exporting = export_mode(points, spec, export)
    export_file = export_path(export_out, out) if exporting is not None else None
    runs_dir = out / "runs"
    results: dict[str, dict] = {}
    todo: dict[str, Point] = {}
    for p in points:
        got = results.get(p.key) or _cached(runs_dir, p.key)
        if got is not None and (exporting is None or "perf_analyzer" in got):  # else: run again for its row
            results[p.key] = got
        else:
            todo.setdefault(p.key, p)
    check_points(points, stack=stack, capacity=spec.get("capacity"), skip=results, progress=progress)
    said = stack_lines(points, stack, stack_follows_device)
    for line in said if notify is not None else ():
        notify(line)
    client, ours = connect(dask) if dask is not None and todo else (None, False)
    try:
        runs_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise output_error(runs_dir, e) from None
    bar = progress_bar(len(points), enabled=progress, initial=len(points) - len(todo), unit="run", desc="sweep")

    def done(p: Point, summary: dict) -> None:
        results[p.key] = summary
        _save_run(runs_dir, p, summary)
        if on_result is not None:
            on_result(p, summary)
        bar.update(1)

    try:
        _execute(list(todo.values()), done, workers, client, spec.get("capacity"), stack, exporting is not None)
    finally:
        bar.close()
        if ours:
            client.close()
    table = _write_results(points, results, out, spec, figure)
    if exporting is not None:
        left_out = write_perf_analyzer(points, results, exporting, export_file, verbose_csv)
        table.attrs["files"].append(str(export_file))
        table.attrs["perf_analyzer_csv"] = str(export_file)
        table.attrs["perf_analyzer_left_out"] = left_out
    table.attrs["stack_lines"] = said
    return table


# ----------------------------------------------------------------------------- perf_analyzer's table
EXPORTS = ("perf-analyzer",)
LOAD_KEYS = {"workload.rate_qps": "request-rate", "workload.clients": "concurrency"}  # swept key -> mode
RATE_KINDS = ("poisson", "gamma", "uniform", "trace")  # the open loops with a rate_qps


def export_mode(points: list[Point], spec: dict[str, Any], export: str | None) -> tuple[str, str] | None:
    """``(mode, swept key)`` of a sweep exported as ``export`` (``None``: no export): a perf_analyzer table needs
    runs (no ``[capacity]``) that differ in one load only, ``workload.rate_qps`` of an open loop (request-rate
    mode) or ``workload.clients`` of a closed loop (concurrency mode); anything else is a one-line
    :class:`UsageError` on ``--export`` naming the fix. Checked before any run."""
    if export is None:
        return None
    if export not in EXPORTS:
        raise UsageError("--export", f"unknown format {export!r}; allowed: {', '.join(EXPORTS)}")
    if spec.get("capacity") is not None:
        raise UsageError("--export", "perf_analyzer's table is made of runs, not capacity searches: drop the sweep "
                                     "file's [capacity] table")
    fix = ("vary only workload.rate_qps (request-rate mode, an open loop) or workload.clients (concurrency mode, "
           'kind = "closed") in the sweep file')
    others = [k for k in varying_keys(points) if k not in LOAD_KEYS]
    loads = [k for k in _swept_keys(points) if k in LOAD_KEYS]
    if others and not loads:
        raise UsageError("--export", f"the sweep varies {', '.join(map(repr, others))}, "
                                     f"{'which is not a load' if len(others) == 1 else 'none of them a load'}; {fix}")
    if others:
        seeds = " (and no [seeds]: one run per load)" if "workload.seed" in others else ""
        raise UsageError("--export", f"the sweep also varies {', '.join(map(repr, others))}: perf_analyzer's table "
                                     f"has one load column; {fix}{seeds}, a sweep for each other setting")
    if len(loads) != 1:
        raise UsageError("--export", f"the sweep varies {'no load' if not loads else ' and '.join(loads)}; {fix}")
    key, mode = loads[0], LOAD_KEYS[loads[0]]
    for i, p in enumerate(points):
        kind = (p.config.get("workload") or {}).get("kind")
        if (kind == "closed") != (mode == "concurrency") or (mode == "request-rate" and kind not in RATE_KINDS):
            need = ('a closed loop (workload.kind = "closed")' if mode == "concurrency" else
                    f"an open loop with a rate (workload.kind = {', '.join(RATE_KINDS)})")
            raise UsageError("--export", f"{mode} mode ({key}) needs {need}, got kind = {kind!r} (sweep point "
                                         f"{i + 1} of {len(points)})")
    return mode, key


def export_path(export_out: str | Path | None, out: Path) -> Path:
    """Where perf_analyzer's table goes: ``export_out`` (a file whose folder can be made and written) or
    ``out/perf_analyzer.csv``."""
    from dvasim.errors import check_out_dir

    path = out / "perf_analyzer.csv" if export_out is None else Path(export_out)
    if str(export_out).strip() == "" or path.is_dir():
        raise UsageError("--export-out", f"{str(export_out)!r} is not a file path; give one, e.g. "
                                         f"{out / 'perf_analyzer.csv'}")
    if path.exists() and not path.is_file():  # /dev/null, a FIFO: refused before the runs, not after them
        raise UsageError("--export-out", f"{str(path)!r} exists and is not a regular file; give the path of a file to "
                                         "(over)write")
    check_out_dir(path.parent, "--export-out")
    return path


def write_perf_analyzer(points: list[Point], results: dict[str, dict], exporting: tuple[str, str], path: Path,
                        verbose: bool = False) -> int:
    """perf_analyzer's table of the sweep's runs written whole to ``path`` (one row per distinct run); returns how
    many runs finished no query (and so have no row)."""
    from dvasim.reporting.perf_analyzer import perf_analyzer_table, write_perf_analyzer_csv

    mode, key = exporting
    rows: dict[str, tuple[Any, Any]] = {}
    for p in points:
        rows.setdefault(p.key, (p.values[key], results[p.key].get("perf_analyzer")))
    table = perf_analyzer_table(rows.values(), mode, verbose=verbose)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise output_error(path, e) from None
    write_perf_analyzer_csv(table, path)
    return int(table.attrs["left_out"])


def _write_results(points: list[Point], results: dict[str, dict], out: Path, spec: dict[str, Any],
                   figure: bool) -> pd.DataFrame:
    """results.csv, results.parquet (each complete or not at all) and the figure; the table, with the files
    written in ``attrs["files"]``."""
    table = results_table(points, results)
    files = [out / "results.csv", out / "results.parquet"]
    write_whole({files[0]: lambda tmp: table.to_csv(tmp, index=False),  # both, or neither when one fails
                 files[1]: lambda tmp: table.to_parquet(tmp, index=False)})
    if figure and len(table):
        cap = spec.get("capacity")
        if cap is not None:
            from dvasim.reporting.plots import capacity_figure

            title = f"capacity with p{cap.get('percentile', 99.0):g} <= {cap['slo_ms']:g} ms"
            files.append(out / "capacity.png")
            write_whole({files[-1]: lambda tmp: capacity_figure(table, tmp, slo_ms=cap["slo_ms"], title=title)})
        else:
            files.append(out / figure_name(figure_key(points)))
            write_whole({files[-1]: lambda tmp: latency_figure(table, points, tmp)})
    table.attrs["files"] = [str(f) for f in files]
    return table


def _execute(todo: list[Point], done: Callable[[Point, dict], None], workers: int | None, client: Any,
             capacity: dict | None = None, stack: str | None = None, perf: bool = False) -> None:
    if not todo:
        return
    if client is not None:
        from distributed import as_completed

        futures = {client.submit(run_point, p.config, capacity, stack, perf, key=f"dvasim-run-{p.key}",
                                 pure=False): p for p in todo}
        try:
            for fut in as_completed(futures):
                done(futures[fut], fut.result())
        finally:
            pending = [f for f in futures if not f.done()]
            if pending:  # a failed run or Ctrl-C: the cluster stops what is left
                client.cancel(pending)
        return
    workers = workers or os.cpu_count() or 1
    if workers <= 1 or len(todo) == 1:
        for p in todo:
            done(p, run_point(p.config, capacity, stack, perf))
        return
    from concurrent.futures import as_completed as cf_completed

    from dvasim.studies.parallel import stop_pool, worker_leaves_signals

    # the workers leave Ctrl-C to this process, which ends them at once on it, on SIGTERM or on a failed run (a
    # worker that took Ctrl-C itself would go on to its next run, and the exit would wait for every run under way)
    pool = ProcessPoolExecutor(max_workers=min(workers, len(todo)), initializer=worker_leaves_signals)
    try:
        futures = {pool.submit(run_point, p.config, capacity, stack, perf): p for p in todo}
        for fut in cf_completed(futures):
            done(futures[fut], fut.result())
    except BaseException:
        stop_pool(pool)  # start nothing more, and end the runs under way
        raise
    pool.shutdown()


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
    varying = _varying_subkeys(points)  # a swept section's label names only the keys that differ between tables
    rows = []
    for p in points:
        row = {column_name(k): _cell(p.values.get(k)) for k in keys}
        row["label"] = ", ".join(label(p.values[k], varying[k]) for k in keys
                                 if k in p.values and k not in ("workload.seed", "workload.rate_qps"))
        row["run"] = p.key
        row.update({k: v for k, v in results[p.key].items() if k not in row and k != "perf_analyzer"})
        if p.stack_note:  # held by the sweep, not set by the user (hold_stack)
            row["stack_source"] = p.stack_note
        rows.append(row)
    return pd.DataFrame(rows)


def _varying_subkeys(points: list[Point]) -> dict[str, set]:
    """For each swept key whose values are tables (a whole section), the keys whose values differ between them."""
    return {k: _differing([p.values[k] for p in points if isinstance(p.values.get(k), dict)])
            for k in _swept_keys(points)}


def _differing(tables: list[dict]) -> set:
    """The keys whose values differ between ``tables`` (the others go without saying in a label)."""
    names = {n for t in tables for n in t}
    return {n for n in names if len({json.dumps(t.get(n), sort_keys=True) for t in tables}) > 1}


def varying_keys(points: list[Point]) -> list[str]:
    """The swept keys that take more than one value over the sweep, in the sweep's order."""
    return [k for k in _swept_keys(points)
            if len({json.dumps(p.values.get(k), sort_keys=True, default=str) for p in points}) > 1]


def figure_key(points: list[Point]) -> str | None:
    """The swept key a sweep's figure puts on its x axis: the load (``workload.rate_qps``) when it varies, else
    the first swept key with more than one value (the seed only when nothing else varies); ``None`` when nothing
    varies (the figure then shows the measured offered load)."""
    varying = varying_keys(points)
    if "workload.rate_qps" in varying:
        return "workload.rate_qps"
    rest = [k for k in varying if k != "workload.seed"]
    return rest[0] if rest else (varying[0] if varying else None)


def figure_name(key: str | None) -> str:
    """The file name of a sweep's latency figure with ``key`` (:func:`figure_key`) on its x axis."""
    if key in (None, "workload.rate_qps"):
        return "latency_vs_load.png"
    return "latency_vs_" + re.sub(r"[^A-Za-z0-9]+", "_", key).strip("_") + ".png"


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def latency_figure(table: pd.DataFrame, points: list[Point], path: str | Path) -> Path:
    """Mean and p99 latency of a sweep's runs against the swept key (:func:`figure_key`), written to ``path``
    (the sweep names it :func:`figure_name`): a line per combination of the other varying keys (the seeds
    averaged, with their 95% interval), numbers along a numeric axis, labels along a categorical one; the
    ``[qos]`` target marked on the p99 panel when every run shares it."""
    from dvasim.reporting.plots import (
        _plt,
        axis_label,
        label_palette,
        mark_groups,
        save_figure,
        slo_line,
        table_context,
        verdict_legend,
    )

    plt, sns = _plt()
    key, subkeys = figure_key(points), _varying_subkeys(points)
    others = [k for k in varying_keys(points) if k not in (key, "workload.seed")]
    df = table.copy()
    df["_runs"] = [", ".join(label(p.values[k], subkeys[k]) for k in others) or "all runs" for p in points]
    labels, palette = label_palette(df["_runs"])
    numeric = key is None or all(_is_number(p.values[key]) for p in points)
    if key is None or key == "workload.rate_qps":
        x, xlabel = ("offered_qps" if key is None else key), "offered load (queries/s)"
    elif numeric:
        x, xlabel = key, axis_label(key)
    else:
        x, xlabel = "_x", key
        df["_x"] = [label(p.values[key], subkeys[key]) for p in points]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, metric, name in zip(axes, ("mean_latency_ms", "p99_latency_ms"), ("mean", "p99")):
        common = dict(data=df, x=x, y=metric, hue="_runs", hue_order=labels, palette=palette,
                      errorbar=("ci", 95), ax=ax)
        if numeric:
            sns.lineplot(marker="o", **common)
        else:
            sns.pointplot(order=list(dict.fromkeys(df["_x"])), linestyle="none", dodge=0.3 if len(labels) > 1
                          else False, **common)
            ax.tick_params(axis="x", rotation=15)
        ax.set(xlabel=xlabel, ylabel=f"{name} latency (ms)", title=f"{name} latency")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.05)  # latencies from zero (and the SLO's mark never below the axis)
        # a point whose runs were not stable carries its verdict's marker (plots.mark_groups)
        mark_groups(ax, df, x, metric, "_runs",
                    positions=None if numeric else {v: i for i, v in enumerate(dict.fromkeys(df["_x"]))})
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    if len(labels) <= 1:  # one line: its label says nothing; the verdicts' markers keep theirs
        for line in axes[1].get_lines():
            line.set_label("_" + line.get_label())
    verdict_legend(axes[1], ", ".join(others) if len(labels) > 1 else None)
    targets = df["qos_target_ms"].dropna().unique() if "qos_target_ms" in df else []
    if len(targets) == 1:
        slo_line(axes[1], float(targets[0]), "y")
    # what was run: the models, devices, stacks, policies and load of the sweep's points
    skip = ("load",) if key is None or key == "workload.rate_qps" else ()
    context = table_context(df, [p.config for p in points], skip=skip)
    rates = f", load: {df[x].min():.4g} to {df[x].max():.4g} queries/s" if skip else ""
    return save_figure(fig, path, f"latency against {xlabel}\n{context}{rates}")


RUN_METRICS = ("mean_latency_ms", "p99_latency_ms", "qos_violation_rate", "stable", "verdict")
CAPACITY_METRICS = ("capacity_qps", "resolution", "n_probes", "top_exceeded", "n_metastable")


def swept_columns(table: pd.DataFrame) -> list[str]:
    """The results columns of the swept keys (those before ``label``)."""
    cols = list(table.columns)
    return cols[: cols.index("label")] if "label" in cols else []


def overview(table: pd.DataFrame) -> pd.DataFrame:
    """The short table ``dvasim sweep`` prints: the swept keys (a whole section by its short label), the main
    metrics (:data:`RUN_METRICS`, or :data:`CAPACITY_METRICS` for capacity searches) and ``flags``: ``unstable``
    (served less than offered), ``SLO missed`` (p99 over the run's ``[qos] target_ms``), ``stuck`` (queries never
    finished); for a capacity search ``at least`` (the top of the bracket was never exceeded) and ``SLO missed``
    (even at the bottom of the bracket)."""
    out = pd.DataFrame(index=table.index)
    for c in swept_columns(table):
        if c.startswith("["):  # a whole section: its short label, by the keys that differ between its tables
            tables = [json.loads(v) if isinstance(v, str) else {} for v in table[c]]
            keep = _differing(tables)
            out[c] = [label(t, keep) for t in tables]
        else:
            out[c] = table[c]
    capacity = "capacity_qps" in table
    for m in CAPACITY_METRICS if capacity else RUN_METRICS:
        if m in table:
            out[m] = table[m]
    out["flags"] = [", ".join(run_flags(row, capacity)) for _, row in table.iterrows()]
    return out


def run_flags(row: pd.Series, capacity: bool = False) -> list[str]:
    """What is wrong with one row of a sweep's results (:func:`overview`'s ``flags``)."""
    def no(v: Any) -> bool:
        return v is not None and not pd.isna(v) and not bool(v)

    flags = []
    if capacity:
        if no(row.get("top_exceeded")):
            flags.append("at least")
        if row.get("capacity_qps") == 0:
            flags.append("SLO missed")
        if _is_number(row.get("n_metastable")) and row["n_metastable"] > 0:
            flags.append("metastable above")
        return flags
    verdict = row.get("verdict")
    if isinstance(verdict, str) and verdict not in ("stable", "over-SLO"):
        flags.append(verdict)  # unstable, metastable, rejecting (over-SLO: the next flag says it)
    elif not isinstance(verdict, str) and no(row.get("stable")):
        flags.append("unstable")
    p99, target = row.get("p99_latency_ms"), row.get("qos_target_ms")
    if _is_number(p99) and _is_number(target) and (math.isnan(p99) or p99 > target):
        flags.append("SLO missed")
    if isinstance(row.get("stuck"), str) and row["stuck"]:
        flags.append("stuck")
    return flags
