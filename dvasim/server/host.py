"""The host of a GPU run: the CPU threads that launch the stages' kernels.

On a GPU, a stage execution is two pieces of work: the host launching it (copying the batch into place and
enqueueing the stage's kernels: seconds of CPU per thousand kernels, measured by ``dvasim profile --device cuda``
as each module kind's *launch cost*) and the GPU running the kernels (the table's GPU time). Measured on an H100
(``traces/h100_replays/README.md``), a TorchScript BERT-base stage at batch 1 costs 0.6-1.6 ms of launching for
0.25 ms of GPU work, so small batches are bound by the host, not the GPU: a simulator that knows only GPU time
predicts a capacity four times too high. This module models the host side:

* every stage launch costs host time ``launch(modules, stage, batch size, length) * launch_scale`` (from a
  launch table written by the profiler, or a per-stage law ``launch_ms[s] + launch_per_row_ms[s] * b`` fitted
  by ``dvasim fit``), plus the buffer copies ``copy_ms[s] + copy_per_row_ms[s] * b`` and a fixed Python-level
  cost ``python_ms``;
* launches run on ``cores`` launching cores (processor sharing: ``n`` launches at once on ``cores`` cores each
  progress at ``min(1, cores / n)``);
* Python-level work is serialised by one interpreter lock (the GIL, a second processor-sharing resource of
  capacity one): the copies' fixed cost ``copy_ms`` and ``python_ms`` of every launch, and for ``modules =
  "eager"`` the launch itself (an eager stage returns to the interpreter between operators). TorchScript and
  CUDA-graph launches run their kernels' launching in C++ without the lock, and so do the copies' per-row part
  ``copy_per_row_ms * b`` (torch's copy bindings release the lock: :meth:`HostModel.copy_rows`), which runs on a
  launching core before the GPU starts;
* a launch stalls with probability ``stall_prob`` (``stall_cluster_prob`` within ``stall_window_ms`` after another
  stall began: a disturbed host stalls in bursts) for an extra host time drawn from the quantiles ``stall_ms``
  (measured: 1-3 % of the H100 replays' launches took 3-25 ms longer than any batch size explains; rare, but
  they are what makes a replay's p99 three times its median at low load);
* the GPU time (the model's table, or ``gpu_table`` when the policy's table is not GPU-true, e.g. a table timed
  with CUDA events around host-bound launches) runs on the device-sharing model (:mod:`dvasim.engines.sim.device`) from
  the moment the kernels start
  being launched (after the copies); the execution is done when both its launching and its GPU work are done.

Order of one execution: the executor's hand-off (``[engine] launch_overhead_ms``, control-plane Python), the
copies and ``python_ms``, all holding the lock; then the launch (on a core; holding the lock too if eager) while
the GPU works.

Launch-table format (``<table>.launch.csv``, written by ``dvasim profile --device cuda``): columns
``modules,stage,batch_size,seq_len,launch_ms`` (``seq_len`` empty for image models) and ``# key: value``
provenance lines. Launch costs are interpolated linearly in batch size and length within the profiled range and
held at the nearest profiled value outside it (a launch's cost is nearly flat in both: it enqueues the same
kernels).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dvasim.core.arith import int_sum
from dvasim.errors import ConfigError
from dvasim.schema import MAX_FACTOR, Key, Section, find_file

MODULE_KINDS = ("eager", "torchscript", "cudagraph", "tensorrt", "tensorflow")
LAW_KEYS = ("launch_fixed_ms", "launch_per_op_ms", "launch_model_per_row_ms")
STAGE_LAW_KEYS = ("stage_launch_ms", "stage_launch_per_row_ms", "stage_operators")  # per-stage lines at one cut

HOST = Section("engine.host", "the host of a GPU run: launch costs, launching cores, the interpreter lock, stalls", (
    Key("modules", "choice", 'module kind whose launch costs apply: eager (launches hold the interpreter lock), torchscript, cudagraph', default="torchscript", choices=MODULE_KINDS),
    Key("cores", "number", 'host cores that launch stages (launches beyond that share them)', default=16.0, minimum=1),
    Key("launch_table", "path", 'a launch-cost table (modules,stage,batch_size,seq_len,launch_ms) from dvasim profile --device cuda'),
    Key("launch_ms", "per_stage", 'per-stage host launch cost at batch 0 (a number for every stage, or a list, ms)', minimum=0),
    Key("launch_per_row_ms", "per_stage", 'per-stage growth of the launch cost per batch row (number or list, ms)', minimum=0),
    Key("launch_fixed_ms", "number", 'the launch law (any slicing): host cost of every stage launch (ms)', minimum=0),
    Key("launch_per_op_ms", "number", 'the launch law: host cost per operator of the launched stage (ms)', minimum=0),
    Key("launch_model_per_row_ms", "number", "the launch law: a whole model's launch growth per batch row, shared by the stages in proportion to their operators (ms)", minimum=0),
    Key("stage_launch_ms", "numbers", "per-stage launch lines at one cut (dvasim fit writes the replayed cut's): each stage's launch at batch 0 (ms), used instead of the law when the run's stages have exactly stage_operators", minimum=0),
    Key("stage_launch_per_row_ms", "numbers", "the per-stage lines' growth per batch row (ms), with stage_launch_ms", minimum=0),
    Key("stage_operators", "ints", "the cut the per-stage lines belong to: the operators in each stage", minimum=1),
    Key("first_launch_ms", "number", "more (or, negative, less) launch cost of the first stage than its operators imply (ms; the model's input side: any slicing has a first stage)"),
    Key("last_launch_ms", "number", 'more (or less) launch cost of the last stage than its operators imply (ms; the output side)'),
    Key("first_copy_ms", "number", "more copy cost of the first stage's launch: the batch's inputs brought in (ms, under the lock)"),
    Key("first_copy_per_row_ms", "number", 'more copy cost of the first stage per batch row (ms; on a core, without the lock)'),
    Key("launch_scale", "number", 'factor on every launch cost (a host faster or slower than the profiled one)', default=1.0, minimum=1 / MAX_FACTOR, maximum=MAX_FACTOR),
    Key("copy_ms", "per_stage", 'per-stage buffer-copy cost of a launch at batch 0 (number or list, ms; holds the interpreter lock)', minimum=0),
    Key("copy_per_row_ms", "per_stage", 'per-stage growth of the copy cost per batch row (number or list, ms; on a core, without the interpreter lock)', minimum=0),
    Key("copy_lock", "choice", 'what of a copy holds the interpreter lock: "fixed" (copy_ms alone; the per-row part runs on a core, as torch\'s copy bindings release the lock) or "all" (the whole copy: the model before 2026-11-28, which also stands in for a host whose driver calls serialise)', default="fixed", choices=("fixed", "all")),
    Key("python_ms", "number", 'Python-level cost of every launch that holds the interpreter lock (ms)', default=0.0, minimum=0),
    Key("gpu_table", "path", "a per-stage table of GPU time (CUDA graph replays, dvasim profile --device cuda) for the device model; the policy still decides with [model]'s table"),
    Key("stall_prob", "number", 'probability that a launch stalls (the host thread descheduled, a re-specialising TorchScript call)', default=0.0, minimum=0, maximum=1),
    Key("stall_ms", "numbers", "quantiles (evenly spaced levels 0..1) of a stall's extra host time, ms", default=[], minimum=0),
    Key("stall_cluster_prob", "number", 'probability that a launch stalls within stall_window_ms after another stall began (bursts)', minimum=0, maximum=1),
    Key("stall_window_ms", "number", 'how long after a stall the host stays disturbed (ms)', default=50.0, minimum=0),
))


class LaunchTable:
    """Host launch cost by module kind, stage, batch size and (for token models) length, from a CSV file."""

    def __init__(self, rows: dict[tuple[str, int], dict[int | None, list[tuple[int, float]]]], provenance=None,
                 path: str = ""):
        self.rows = rows  # (modules, stage) -> {seq_len or None: [(batch_size, ms), ...] sorted}
        self.provenance = dict(provenance or {})
        self.path = path

    @classmethod
    def load(cls, path, field_name: str = "engine.host.launch_table") -> LaunchTable:
        import pandas as pd

        from dvasim.model.table import read_provenance_csv

        p = Path(path)
        if not p.is_file():
            raise ConfigError(field_name, f"file {str(p)!r} not found; give a launch table from dvasim profile --device cuda")
        try:
            prov, body = read_provenance_csv(p.read_text())
            import io

            df = pd.read_csv(io.StringIO(body))
        except (UnicodeDecodeError, ValueError) as e:
            raise ConfigError(field_name, f"{p}: not a readable CSV ({e})") from None
        need = {"modules", "stage", "batch_size", "launch_ms"}
        if not need <= set(df.columns):
            raise ConfigError(field_name, f"{p}: needs columns modules,stage,batch_size,seq_len,launch_ms; "
                                          f"has {','.join(df.columns)}")
        if df.empty or not (df["launch_ms"].astype(float) >= 0).all() or df["batch_size"].min() < 1:
            raise ConfigError(field_name, f"{p}: launch_ms must be >= 0 and batch_size >= 1 on every row")
        rows: dict = {}
        has_len = "seq_len" in df.columns and df["seq_len"].notna().any()
        for r in df.itertuples(index=False):
            L = int(r.seq_len) if has_len and not _isnan(r.seq_len) else None
            rows.setdefault((str(r.modules), int(r.stage)), {}).setdefault(L, []).append(
                (int(r.batch_size), float(r.launch_ms)))
        for by_len in rows.values():
            for pts in by_len.values():
                pts.sort()
        return cls(rows, prov, str(p))

    def kinds(self) -> set[str]:
        return {k for k, _ in self.rows}

    def n_stages(self, modules: str) -> int:
        return 1 + max((s for k, s in self.rows if k == modules), default=-1)

    def cost(self, modules: str, stage: int, batch_size: int, seq_len: int | None = None) -> float:
        by_len = self.rows.get((modules, stage))
        if by_len is None:
            raise ConfigError("engine.host.launch_table", f"{self.path}: no launch costs for modules = {modules!r}, "
                                                          f"stage {stage}")
        lens = sorted(k for k in by_len if k is not None)
        if not lens or seq_len is None:
            return _interp(by_len[lens[0] if lens else None], batch_size)
        if seq_len <= lens[0]:
            return _interp(by_len[lens[0]], batch_size)
        if seq_len >= lens[-1]:
            return _interp(by_len[lens[-1]], batch_size)
        hi = next(k for k in lens if k >= seq_len)
        lo = max(k for k in lens if k <= seq_len)
        a, b = _interp(by_len[lo], batch_size), _interp(by_len[hi], batch_size)
        return a if hi == lo else a + (b - a) * (seq_len - lo) / (hi - lo)


def _isnan(x) -> bool:
    try:
        return math.isnan(float(x))
    except (TypeError, ValueError):
        return True


def _interp(pts: list[tuple[int, float]], b: int) -> float:
    if b <= pts[0][0]:
        return pts[0][1]
    if b >= pts[-1][0]:
        return pts[-1][1]
    for (b0, t0), (b1, t1) in zip(pts, pts[1:]):
        if b0 <= b <= b1:
            return t0 + (t1 - t0) * (b - b0) / (b1 - b0)
    return pts[-1][1]  # pragma: no cover


@dataclass
class HostModel:
    """Host costs of launching stages (see the module docstring). Built by :func:`host_from_config`."""

    n_stages: int
    modules: str = "torchscript"
    cores: float = 16  # effective launching cores (a fitted value may be fractional)
    launch_ms: list[float] = field(default_factory=list)
    launch_per_row_ms: list[float] = field(default_factory=list)
    launch_scale: float = 1.0
    copy_ms: list[float] = field(default_factory=list)
    copy_per_row_ms: list[float] = field(default_factory=list)
    python_ms: float = 0.0
    copy_lock: str = "fixed"  # "all": the per-row part of the copies holds the lock too
    table: LaunchTable | None = None
    stall_prob: float = 0.0
    stall_ms: list[float] = field(default_factory=list)
    stall_cluster_prob: float | None = None  # within stall_window_ms after a stall began; None: stall_prob
    stall_window_ms: float = 50.0
    gpu_table: Any = None  # a LatencyTable of GPU time, or None: the model's table is the GPU time
    law: dict = field(default_factory=dict)  # the launch law the per-stage lists came from (any slicing)
    operators: list[int] | None = None  # the operators in each stage the law was applied to

    def gpu(self, ex) -> tuple[float, float]:
        """GPU time and demand of execution ``ex`` on the device."""
        if self.gpu_table is None:
            return ex.standalone_ms, ex.demand
        L = ex.seq_len if self.gpu_table.seq_lens is not None else None
        b = ex.charged_batch_size  # dummy rows of a padding policy run on the GPU too
        return self.gpu_table.latency(ex.stage, b, L), self.gpu_table.demand(ex.stage, b, L)

    @property
    def locks_launch(self) -> bool:
        """Eager launches return to the interpreter between operators: they hold the lock throughout."""
        return self.modules == "eager"

    def launch(self, stage: int, batch_size: int, seq_len: int | None = None) -> float:
        if self.table is not None:
            base = self.table.cost(self.modules, stage, batch_size, seq_len)
        else:
            base = self.launch_ms[stage] + self.launch_per_row_ms[stage] * batch_size
        return base * self.launch_scale

    @property
    def holds_lock(self) -> bool:
        """Whether any launch does Python-level work under the lock (:meth:`locked`, or an eager launch)."""
        return (self.locks_launch or self.python_ms > 0 or any(self.copy_ms)
                or (self.copy_lock == "all" and any(self.copy_per_row_ms)))

    def locked(self, stage: int, batch_size: int) -> float:
        """Python-level work before the launch (the copies' fixed cost + interpreter overhead), holding the lock."""
        if self.copy_lock == "all":
            return self.copy_ms[stage] + self.copy_per_row_ms[stage] * batch_size + self.python_ms
        return self.copy_ms[stage] + self.python_ms

    def copy_rows(self, stage: int, batch_size: int) -> float:
        """The copies' per-row part, after the locked work and before the GPU starts, on a launching core and
        without the interpreter lock: the bytes are moved inside torch's ``copy_`` / ``to`` / ``index_select``,
        whose Python bindings release the lock around the call (``dispatch_copy_`` and ``dispatch_to`` in
        torch/csrc/autograd/python_variable_methods.cpp: ``pybind11::gil_scoped_release``), as the replay's input
        gather and buffer copies run them (:meth:`dvasim.model.stages.buffers.InputStore.gather`,
        :meth:`~dvasim.model.stages.buffers.BufferSet.write`). Measured on the H200 matrix
        (traces/gpu_matrix/h200_2026-11-28): the first stage's 3 ms input copy at batch 16 did not stop the other
        stages' executors; held under the lock, it made the simulated DVABatch saturate at 0.85 load.)
        ``copy_lock = "all"``: 0 (the part is in :meth:`locked`)."""
        return 0.0 if self.copy_lock == "all" else self.copy_per_row_ms[stage] * batch_size

    def describe(self) -> dict[str, Any]:
        out = {"modules": self.modules, "cores": self.cores, "launch_scale": self.launch_scale,
               "copy_ms": self.copy_ms, "copy_per_row_ms": self.copy_per_row_ms, "copy_lock": self.copy_lock,
               "python_ms": self.python_ms}
        if self.stall_prob > 0 or self.stall_cluster_prob:
            out.update(stall_prob=self.stall_prob, stall_ms=self.stall_ms)
            if self.stall_cluster_prob is not None:
                out.update(stall_cluster_prob=self.stall_cluster_prob, stall_window_ms=self.stall_window_ms)
        if self.gpu_table is not None:
            out["gpu_table"] = getattr(self.gpu_table, "path", self.gpu_table.name)
        if self.table is not None:
            out["launch_table"] = self.table.path
        else:
            out.update(launch_ms=self.launch_ms, launch_per_row_ms=self.launch_per_row_ms)
        if self.law:
            out.update(self.law, operators=self.operators)
        return out


def _per_stage(d: dict, key: str, n: int, default: float = 0.0) -> list[float]:
    v = d.get(key, default)
    vals = v if isinstance(v, list) else [v] * n
    if len(vals) != n:
        raise ConfigError(f"engine.host.{key}", f"must be a number >= 0 or a list of {n} (one per stage), got {v!r}")
    return [float(x) for x in vals]


BOUNDARY_KEYS = ("first_launch_ms", "last_launch_ms", "first_copy_ms", "first_copy_per_row_ms")


def host_from_config(d: dict | None, n_stages: int, base_dir: str | None = None,
                     operators: list[int] | None = None) -> HostModel | None:
    """The ``[engine.host]`` table as a :class:`HostModel` (``None`` when the table is absent or empty).

    The launch cost is a law that fits any slicing (``launch_fixed_ms + launch_per_op_ms * ops[s]`` per launch,
    plus ``launch_model_per_row_ms * ops[s] / sum(ops)`` per row, ``ops`` = ``operators``, the operators in each
    stage), or per-stage lists ``launch_ms`` / ``launch_per_row_ms`` that fit only the stage count they were
    written for, or a launch table. Types and ranges are :data:`HOST`'s; what ties keys together is checked here."""
    if not d:
        return None
    if not isinstance(d, dict):
        raise ConfigError("engine.host", "must be a table of keys, e.g. [engine.host] launch_ms = 0.5")
    d = HOST.check(d)
    get = {k.name: d.get(k.name, k.default) for k in HOST.keys if k.has_default}
    stall = _stalls(d, get)
    gpu_table = _gpu_table(d, n_stages, base_dir)
    d, law, ops = _launch_law(d, n_stages, operators)
    table = _launch_table(d, get["modules"], n_stages, base_dir)
    launch_ms = _per_stage(d, "launch_ms", n_stages)
    copy_ms, copy_per_row = _per_stage(d, "copy_ms", n_stages), _per_stage(d, "copy_per_row_ms", n_stages)
    edges = _boundaries(d, table, launch_ms, copy_ms, copy_per_row, n_stages)
    if edges:
        law = {**law, **edges}
    return HostModel(
        n_stages=n_stages, modules=get["modules"], cores=float(get["cores"]),
        launch_ms=launch_ms, launch_per_row_ms=_per_stage(d, "launch_per_row_ms", n_stages),
        launch_scale=float(get["launch_scale"]), copy_ms=copy_ms,
        copy_per_row_ms=copy_per_row, python_ms=float(get["python_ms"]), copy_lock=str(get["copy_lock"]), table=table,
        stall_prob=float(get["stall_prob"]), stall_ms=stall, gpu_table=gpu_table,
        stall_cluster_prob=d.get("stall_cluster_prob"), stall_window_ms=float(get["stall_window_ms"]), law=law,
        operators=ops if law else None,
    )


def _stalls(d: dict, get: dict) -> list[float]:
    """The stalls' quantiles, which a stall probability (or a cluster probability) needs."""
    stall = d.get("stall_ms", [])
    if (get["stall_prob"] > 0 and len(stall) < 2) or any(b < a for a, b in zip(stall, stall[1:])):
        raise ConfigError("engine.host.stall_ms", "must be a list of >= 2 non-decreasing quantiles >= 0 (ms) when "
                                                  "stall_prob > 0, e.g. [3.0, 5.5, 20.0]")
    if d.get("stall_cluster_prob") and len(stall) < 2:
        raise ConfigError("engine.host.stall_ms", "give the stalls' quantiles (>= 2) with stall_cluster_prob")
    return [float(x) for x in stall]


def _gpu_table(d: dict, n_stages: int, base_dir: str | None):
    if "gpu_table" not in d:
        return None
    from dvasim.model.table import LatencyTable

    gp = find_file(d["gpu_table"], base_dir, "engine.host.gpu_table")
    gpu_table = LatencyTable.load(gp)
    gpu_table.path = str(gp)
    if gpu_table.n_stages != n_stages:
        raise ConfigError("engine.host.gpu_table", f"{gp} has {gpu_table.n_stages} stages; the model has {n_stages}")
    return gpu_table


def _launch_law(d: dict, n_stages: int, operators) -> tuple[dict, dict, list[int] | None]:
    """The launch law, when given, turned into per-stage ``launch_ms`` / ``launch_per_row_ms`` over the stages'
    operators: (the table with them in place of the law's keys, the law, the operator counts). Where the file
    also holds per-stage lines (:data:`STAGE_LAW_KEYS`, as ``dvasim fit`` writes the replayed cut's) and the run's
    stages have exactly their ``stage_operators``, those lines are the launch costs (the measured ends included:
    the law's ``first_launch_ms`` / ``last_launch_ms`` are not added); at any other cut the law is (issue 35: a
    law over operator counts moves one stage's cost onto others)."""
    law = {k: d[k] for k in LAW_KEYS if k in d}
    staged = _stage_lines_given(d, law)
    if staged:
        d = {k: v for k, v in d.items() if k not in STAGE_LAW_KEYS}
        run_ops = None if operators is None else [int(x) for x in operators]
        if run_ops == staged["stage_operators"] and len(run_ops) == n_stages:
            d = {k: v for k, v in d.items() if k not in (*LAW_KEYS, "first_launch_ms", "last_launch_ms")}
            d["launch_ms"] = [float(x) for x in staged["stage_launch_ms"]]
            d["launch_per_row_ms"] = [float(x) for x in staged["stage_launch_per_row_ms"]]
            return d, {**law, "launch_from": "the per-stage lines (the run's cut is stage_operators)"}, run_ops
        law = {**law, "launch_from": "the law (the run's cut differs from the per-stage lines' stage_operators)"}
    if not law:
        return d, law, None
    clash = [k for k in ("launch_ms", "launch_per_row_ms", "launch_table") if k in d]
    if clash:
        raise ConfigError(f"engine.host.{clash[0]}", f"give either the launch law ({', '.join(LAW_KEYS)}) or "
                                                     f"{clash[0]}, not both")
    ops = [int(x) for x in operators] if operators is not None else [1] * n_stages
    if len(ops) != n_stages or min(ops) < 1:
        raise ConfigError("engine.host.launch_per_op_ms", f"needs {n_stages} operator counts >= 1, got {ops}")
    total = int_sum(ops)
    d = {k: v for k, v in d.items() if k not in LAW_KEYS}
    d["launch_ms"] = [law.get("launch_fixed_ms", 0.0) + law.get("launch_per_op_ms", 0.0) * o for o in ops]
    d["launch_per_row_ms"] = [law.get("launch_model_per_row_ms", 0.0) * o / total for o in ops]
    return d, law, ops


def _stage_lines_given(d: dict, law: dict) -> dict:
    """The per-stage launch lines of ``d`` (:data:`STAGE_LAW_KEYS`), checked: all three or none, one entry per
    stage each, and a law beside them for the other cuts."""
    given = {k: d[k] for k in STAGE_LAW_KEYS if k in d}
    if not given:
        return given
    missing = [k for k in STAGE_LAW_KEYS if k not in given]
    if missing:
        raise ConfigError(f"engine.host.{missing[0]}", f"give it with {', '.join(k for k in STAGE_LAW_KEYS if k != missing[0])}"
                                                      " (per-stage launch lines and the cut they belong to)")
    n = len(given["stage_operators"])
    for k in ("stage_launch_ms", "stage_launch_per_row_ms"):
        if len(given[k]) != n:
            raise ConfigError(f"engine.host.{k}", f"needs {n} values, one per stage of stage_operators; got "
                                                  f"{len(given[k])}")
    if not law:
        raise ConfigError("engine.host.stage_launch_ms", f"give the launch law too ({', '.join(LAW_KEYS)}): the "
                                                         "per-stage lines fit only their own cut")
    given["stage_operators"] = [int(x) for x in given["stage_operators"]]
    return given


def _launch_table(d: dict, modules: str, n_stages: int, base_dir: str | None):
    if "launch_table" not in d:
        return None
    if "launch_ms" in d or "launch_per_row_ms" in d:
        raise ConfigError("engine.host.launch_table", "give either launch_table or launch_ms, not both")
    table = LaunchTable.load(find_file(d["launch_table"], base_dir, "engine.host.launch_table"))
    if modules not in table.kinds():
        raise ConfigError("engine.host.modules", f"{modules!r} has no launch costs in {table.path} "
                                                 f"(it has {', '.join(sorted(table.kinds()))})")
    if table.n_stages(modules) != n_stages:
        raise ConfigError("engine.host.launch_table", f"{table.path} has {table.n_stages(modules)} stages for "
                                                      f"{modules}; the model has {n_stages}")
    return table


def _boundaries(d: dict, table, launch_ms: list, copy_ms: list, copy_per_row: list, n_stages: int) -> dict:
    """The model's two ends (any slicing has a first and a last stage): the inputs' side and the outputs', added
    to the first and last stages' costs in place."""
    edges = {k: d[k] for k in BOUNDARY_KEYS if k in d}
    if table is not None and ("first_launch_ms" in edges or "last_launch_ms" in edges):
        raise ConfigError("engine.host.first_launch_ms", "a launch table gives every stage's launch; drop "
                                                         "first_launch_ms / last_launch_ms")
    for key, lst, s_ in (("first_launch_ms", launch_ms, 0), ("last_launch_ms", launch_ms, n_stages - 1),
                         ("first_copy_ms", copy_ms, 0), ("first_copy_per_row_ms", copy_per_row, 0)):
        if key in edges:
            lst[s_] = lst[s_] + edges[key]
            if lst[s_] < 0:
                raise ConfigError(f"engine.host.{key}", f"leaves stage {s_} a negative cost ({lst[s_]:.4f} ms); "
                                                        "it may lower a stage's cost at most to 0")
    return edges
