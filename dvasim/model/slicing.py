"""Slicing a model into pipeline stages from a per-operator latency profile.

A *slicing* is written as the list of stage boundaries ``bounds``: ``bounds[k]`` is the index of the
first operator of stage ``k``, so ``bounds[0] == 0`` and stage ``k`` holds operators
``bounds[k] .. bounds[k+1]-1`` (the last stage runs to the end). Operators stay in topological order,
every stage holds at least one operator, so any stage count from 1 up to the number of operators is
valid.

Three ways to choose the boundaries:

* :func:`slice_even` -- DVABatch's default (ATC'22 §7.1): "the operators are time-evenly assigned to
  the stages in the topological order". We make "time-evenly" precise as the *linear partition*
  problem: among all ways of cutting the sequence into ``N`` contiguous non-empty stages choose one
  that minimises the slowest stage (the pipeline bottleneck). Among the partitions that reach that
  optimum we take one that maximises the fastest stage, so the balance (slowest / fastest) is as
  small as the bottleneck-optimal partitions allow. Both steps are an exact dynamic programme,
  ``O(N * n_ops^2)`` vectorised over numpy: milliseconds for a few hundred operators and 20 stages.
* :func:`slice_at` -- cut at given operator indices.
* :func:`slice_ratios` -- cut so that each stage gets a given share of the total time (the
  characterization study's "slicing ratio" knob, Yu et al. 2024 §5.1: the share of the compute time
  allocated to ``Stage_0``; with ``N`` stages we take one share per stage).

:func:`stage_table` sums a per-operator :class:`~dvasim.model.table.LatencyTable` into a
per-stage one for every (batch size, sequence length) of its grid. The slicing itself is decided
once, from the operator times at one reference batch size (and sequence length), as DVABatch
profiles and slices offline once per model.

This module is pure numpy/pandas (no torch) so the simulator can slice shipped tables on demand.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from dvasim.errors import ConfigError, TableError

__all__ = [
    "slice_even",
    "slice_at",
    "slice_ratios",
    "stage_sums",
    "balance",
    "format_slicing",
    "stage_table",
]

# Relative tolerance when comparing sums of floats that are equal in exact arithmetic.
_RTOL = 1e-9


def _as_times(op_times: Sequence[float], field: str = "op_times") -> np.ndarray:
    t = np.asarray(op_times, dtype=float)
    if t.ndim != 1 or t.size == 0:
        raise ConfigError(field, "must be a non-empty 1-D sequence of operator times")
    if not np.all(np.isfinite(t)) or np.any(t < 0):
        raise ConfigError(field, "operator times must be finite and >= 0")
    return t


def _check_n_stages(n_stages, n_ops: int, field: str = "model.stages") -> int:
    if isinstance(n_stages, bool) or not isinstance(n_stages, (int, np.integer)):
        raise ConfigError(field, f"must be an integer 1..{n_ops}, got {n_stages!r}")
    n = int(n_stages)
    if not 1 <= n <= n_ops:
        raise ConfigError(field, f"must be 1..{n_ops} (the model has {n_ops} operators), got {n}")
    return n


def slice_even(op_times: Sequence[float], n_stages: int) -> list[int]:
    """Time-even slicing: the boundaries minimising the slowest stage (ties: maximising the fastest).

    ``op_times`` are per-operator latencies in topological order (any unit). Returns ``n_stages`` start
    indices, the first being 0. Exact (dynamic programming over prefix sums), deterministic: among
    equal candidates the earliest cut wins.
    """
    t = _as_times(op_times)
    n = t.size
    k_stages = _check_n_stages(n_stages, n)
    if k_stages == 1:
        return [0]
    prefix = np.concatenate(([0.0], np.cumsum(t)))
    scale = max(prefix[-1], 1e-300)

    # Pass 1: best[k][j] = minimal slowest stage when the first j ops form k stages.
    # Pass 2: among partitions whose every stage is <= that optimum, maximise the fastest stage.
    # Both are evaluated a block of end points j at a time as an (i, j) matrix (last stage = ops i..j-1).
    inf = np.inf
    best = np.full((k_stages + 1, n + 1), inf)
    best[0, 0] = 0.0
    idx_all = np.arange(n + 1)
    block = max(1, 4_000_000 // (n + 1))  # bound the matrices to ~32 MB

    def layers(prev, k, combine, reduce):
        out = np.full(n + 1, -inf if reduce == "max" else inf)
        arg = np.zeros(n + 1, dtype=int)
        j_lo, j_hi = k, n - (k_stages - k)  # leave one op for each later stage
        i = idx_all[k - 1 : j_hi]
        for b0 in range(j_lo, j_hi + 1, block):
            j = idx_all[b0 : min(j_hi, b0 + block - 1) + 1]
            seg = prefix[j][None, :] - prefix[i][:, None]
            cand = combine(prev[i][:, None], seg)
            cand = np.where(i[:, None] < j[None, :], cand, -inf if reduce == "max" else inf)
            if reduce == "min":
                out[j] = cand.min(axis=0)
            else:
                top = cand.max(axis=0)
                # earliest i among near-equal maxima (deterministic, float-noise proof)
                pick = (cand >= (top - _RTOL * scale)[None, :]).argmax(axis=0)
                out[j] = cand[pick, np.arange(j.size)]
                arg[j] = i[pick]
        return out, arg

    for k in range(1, k_stages + 1):
        best[k], _ = layers(best[k - 1], k, np.maximum, "min")
    limit = best[k_stages, n] + _RTOL * scale

    def fastest(prev_fast, seg):
        return np.where(seg <= limit, np.minimum(prev_fast, seg), -inf)

    fast = np.full(n + 1, -inf)
    fast[0] = inf
    args = np.zeros((k_stages + 1, n + 1), dtype=int)
    for k in range(1, k_stages + 1):
        fast, args[k] = layers(fast, k, fastest, "max")
    arg = args
    bounds = [0] * k_stages
    j = n
    for k in range(k_stages, 0, -1):
        i = int(arg[k, j])
        bounds[k - 1] = i
        j = i
    if bounds[0] != 0:  # pragma: no cover - guaranteed by construction
        raise AssertionError("slice_even: internal error, first boundary is not 0")
    return bounds


def slice_at(n_ops: int, cut_indices: Sequence[int], field: str = "model.cuts") -> list[int]:
    """Stages starting at the given operator indices.

    ``cut_indices`` are strictly increasing operator indices in ``1..n_ops-1`` where a new stage starts; a
    leading 0 is accepted and ignored. ``[]`` means one stage. Returns the boundaries (with 0 first).
    """
    if isinstance(n_ops, bool) or not isinstance(n_ops, (int, np.integer)) or n_ops < 1:
        raise ConfigError("n_ops", f"must be a positive integer, got {n_ops!r}")
    cuts = list(cut_indices)
    for c in cuts:
        if isinstance(c, bool) or not isinstance(c, (int, np.integer)):
            raise ConfigError(field, f"cut indices must be integers in 1..{n_ops - 1}, got {c!r}")
    cuts = [int(c) for c in cuts]
    if cuts and cuts[0] == 0:
        cuts = cuts[1:]
    for a, b in zip(cuts, cuts[1:], strict=False):
        if b <= a:
            raise ConfigError(field, f"cut indices must be strictly increasing, got {list(cut_indices)}")
    if cuts and (cuts[0] < 1 or cuts[-1] > n_ops - 1):
        raise ConfigError(field, f"cut indices must be in 1..{n_ops - 1} (the model has {n_ops} operators)")
    return [0, *cuts]


def slice_ratios(op_times: Sequence[float], ratios: Sequence[float] | float, field: str = "model.ratios") -> list[int]:
    """Stages holding given shares of the total time.

    ``ratios`` has one positive weight per stage (normalised to sum 1, so ``[0.3, 0.7]`` and ``[3, 7]``
    are the same); a single number ``r`` in (0, 1) means two stages ``[r, 1 - r]`` (the characterization
    study's slicing ratio ``Stage_0 / (Stage_0 + Stage_1)``). Each cut is placed at the operator boundary
    whose cumulative time is nearest the target cumulative share (ties: the earlier boundary), keeping
    every stage non-empty.
    """
    t = _as_times(op_times)
    n = t.size
    if isinstance(ratios, (int, float, np.floating, np.integer)) and not isinstance(ratios, bool):
        r = float(ratios)
        if not 0.0 < r < 1.0:
            raise ConfigError(field, f"a single slicing ratio must be in (0, 1), got {ratios!r}")
        w = np.array([r, 1.0 - r])
    else:
        try:
            w = np.asarray(list(ratios), dtype=float)
        except (TypeError, ValueError):
            raise ConfigError(field, f"must be a list of positive numbers, got {ratios!r}") from None
        if w.ndim != 1 or w.size == 0 or not np.all(np.isfinite(w)) or np.any(w <= 0):
            raise ConfigError(field, f"must be a non-empty list of positive numbers, got {ratios!r}")
    k_stages = _check_n_stages(int(w.size), n, field=field)
    if k_stages == 1:
        return [0]
    prefix = np.concatenate(([0.0], np.cumsum(t)))
    total = prefix[-1]
    targets = np.cumsum(w / w.sum())[:-1] * total
    bounds = [0]
    for k, target in enumerate(targets, start=1):
        lo = bounds[-1] + 1
        hi = n - (k_stages - k)  # leave one op for each later stage
        cand = np.arange(lo, hi + 1)
        dist = np.abs(prefix[cand] - target)
        bounds.append(int(cand[int(np.argmin(dist))]))
    return bounds


def _check_bounds(bounds: Sequence[int], n_ops: int) -> list[int]:
    b = [int(x) for x in bounds]
    if not b or b[0] != 0 or any(y <= x for x, y in zip(b, b[1:], strict=False)) or b[-1] > n_ops - 1:
        raise ConfigError("bounds", f"must start with 0, be strictly increasing and < {n_ops}, got {list(bounds)}")
    return b


def stage_sums(op_times: Sequence[float], bounds: Sequence[int]) -> np.ndarray:
    """Per-stage sums of the operator times for the given boundaries."""
    t = _as_times(op_times)
    b = _check_bounds(bounds, t.size)
    return np.add.reduceat(t, b)


def balance(op_times: Sequence[float], bounds: Sequence[int]) -> float:
    """Slowest stage / fastest stage (1.0 is perfect; ``inf`` if a stage takes no time)."""
    s = stage_sums(op_times, bounds)
    lo = float(s.min())
    return float(s.max()) / lo if lo > 0 else float("inf")


def format_slicing(method: str, bounds: Sequence[int], bal: float, at: str = "") -> str:
    """One-line description for a table's provenance, e.g. ``time-even N=4 cuts=[0,12,30,51] balance=1.08 at bs=1``."""
    cuts = ",".join(str(int(x)) for x in bounds)
    text = f"{method} N={len(bounds)} cuts=[{cuts}] balance={bal:.3f}"
    return f"{text} {at}".rstrip()


def _op_frame(op_table) -> pd.DataFrame:
    """The long frame (stage, batch_size, latency_ms[, seq_len]) of a LatencyTable."""
    for attr in ("frame", "df", "data"):
        df = getattr(op_table, attr, None)
        if isinstance(df, pd.DataFrame):
            return df
    to_frame = getattr(op_table, "to_frame", None)
    if callable(to_frame):
        return to_frame()
    # Fall back to the public query interface.
    seq_lens = list(op_table.seq_lens or [])
    rows = []
    for s in range(op_table.n_stages):
        for bs in op_table.batch_sizes:
            for sl in seq_lens or [None]:
                lat = op_table.latency(s, bs, sl) if sl is not None else op_table.latency(s, bs)
                row = {"stage": s, "batch_size": int(bs), "latency_ms": float(lat)}
                if sl is not None:
                    row["seq_len"] = int(sl)
                rows.append(row)
    return pd.DataFrame(rows)


def reference_seq_len(seq_lens: Sequence[int]) -> int:
    """The sequence length slicing uses by default: the (lower) median of the profiled ones."""
    s = sorted(int(x) for x in seq_lens)
    return s[(len(s) - 1) // 2]


def stage_table(
    op_table,
    n_stages: int | None = None,
    cuts: Sequence[int] | None = None,
    ratios: Sequence[float] | float | None = None,
    at_batch_size: int = 1,
    seq_len: int | None = None,
    name: str | None = None,
):
    """Per-stage LatencyTable from a per-operator one (``stage`` = operator index).

    Give exactly one of ``n_stages`` (time-even, :func:`slice_even`), ``cuts`` (:func:`slice_at`) or
    ``ratios`` (:func:`slice_ratios`). The slicing is decided once from the operator times at batch
    size ``at_batch_size`` (default 1) and, for tables with a sequence-length axis, at ``seq_len``
    (default: the lower median of the profiled lengths, see :func:`reference_seq_len`); the stage
    latencies are then the sums of their operators' latencies at every (batch size, seq_len) of the grid.
    The provenance gains ``slicing``, ``stages`` and ``source`` entries.
    """
    from dvasim.model.table import LatencyTable

    given = sum(x is not None for x in (n_stages, cuts, ratios))
    if given != 1:
        raise ConfigError("model.stages", "give exactly one of a stage count, cut indices or slicing ratios")
    df = _op_frame(op_table).copy()
    for col in ("stage", "batch_size", "latency_ms"):
        if col not in df.columns:
            raise TableError(col, "per-operator table lacks this column")
    has_seq = "seq_len" in df.columns and df["seq_len"].notna().any()
    ops = np.sort(df["stage"].unique())
    n_ops = int(ops.size)
    if not np.array_equal(ops, np.arange(n_ops)):
        raise TableError("stage", f"per-operator table must have operators 0..{n_ops - 1} without gaps")

    bss = sorted(int(b) for b in df["batch_size"].unique())
    if int(at_batch_size) not in bss:
        raise ConfigError("model.slice_batch_size", f"must be one of the profiled batch sizes {bss}, got {at_batch_size}")
    ref = df[df["batch_size"] == int(at_batch_size)]
    at = f"at bs={int(at_batch_size)}"
    if has_seq:
        sls = sorted(int(s) for s in df["seq_len"].unique())
        sl = reference_seq_len(sls) if seq_len is None else int(seq_len)
        if sl not in sls:
            raise ConfigError("model.slice_seq_len", f"must be one of the profiled sequence lengths {sls}, got {seq_len}")
        ref = ref[ref["seq_len"] == sl]
        at += f" seq_len={sl}"
    ref_times = ref.groupby("stage")["latency_ms"].mean().reindex(np.arange(n_ops)).to_numpy()
    if np.isnan(ref_times).any():
        raise TableError("latency_ms", f"per-operator table lacks some operators {at}")

    if n_stages is not None:
        bounds = slice_even(ref_times, n_stages)
        method = "time-even"
    elif cuts is not None:
        bounds = slice_at(n_ops, cuts)
        method = "at-cuts"
    else:
        bounds = slice_ratios(ref_times, ratios)
        method = "ratios"
    bal = balance(ref_times, bounds)

    stage_of_op = np.searchsorted(np.asarray(bounds), np.arange(n_ops), side="right") - 1
    df["stage"] = stage_of_op[df["stage"].to_numpy().astype(int)]
    keys = ["stage", "batch_size"] + (["seq_len"] if has_seq else [])
    out = df.groupby(keys, as_index=False)["latency_ms"].sum()
    out = out[["stage", "batch_size", "latency_ms"] + (["seq_len"] if has_seq else [])]
    out = out.sort_values(keys, kind="stable").reset_index(drop=True)

    prov = dict(getattr(op_table, "provenance", {}) or {})
    src_name = getattr(op_table, "name", None)
    prov["slicing"] = format_slicing(method, bounds, bal, at)
    prov["stages"] = str(len(bounds))
    prov["cuts"] = ",".join(str(int(b)) for b in bounds)  # the bounds as data: LatencyTable.cuts
    prov["source"] = f"sum of per-operator latencies{f' from {src_name}' if src_name else ''}"
    if name is None:
        name = f"{src_name}_{len(bounds)}st" if src_name else f"{len(bounds)}-stage"
    return LatencyTable.from_frame(out, provenance=prov, name=name)
