"""A check, not a fit: how much longer a stage execution took in a replay while others were open, against what
``[engine] contention = "overlap"`` (calibrated on the four-thread co-run alone,
:mod:`dvasim.studies.contention`) implies. The replays are what the model is to predict, so nothing here sets
a parameter.

    python -m dvasim.fitting.contention [--case traces/h100_replays/resnet152_dvabatch_0.6]

An execution's *slowdown* is its time over the median time of executions of the same stage and batch size in the
reference folders (the ZeroBatch replays of the same model, where one stage runs at a time), over the interval
``[start_ms, end_ms)`` (from the executor taking it, through its hand-off, copies and launch, until its GPU work
completed; ``compute`` beside it: ``[begin_ms, end_ms)``, the launch and its copies only); ``n_open`` is the number
of executions open during it, itself included (time-averaged, rounded). Three things are set beside the measured
slowdowns, by ``n_open``:

* ``stretch``: how much the device model slows GPU work while the execution is open, the others open with it as
  measured, every demand from the GPU-time table (``<model>_gpu_table.csv``): the time average of ``max(1, D)``
  (``"none"``) and ``max(1, D + k (n - D))`` (``"overlap"``) over its span. It is the execution's slowdown if it
  were all GPU work (an upper bound: the replays' TorchScript stages spend most of their time launching);
* ``sim``: the slowdowns of the same case simulated with the fitted engine (``experiments/h100_fit/
  engine_<model>_gputable.toml``: host costs fitted on ZeroBatch, GPU time from the GPU table), against the
  simulated ZeroBatch cases, with ``contention = "none"`` and ``"overlap"``: what the simulator as a whole predicts.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dvasim.config.sections import OVERLAP_SHARE_H100
from dvasim.paths import DATA_ROOT

REPLAYS = DATA_ROOT / "traces" / "h100_replays"
ENGINES = DATA_ROOT / "experiments" / "h100_fit"
MIN_REFERENCE = 3  # executions of a (stage, batch size) in the reference folders for its median to count


def _open_sets(begin: np.ndarray, end: np.ndarray) -> list[list[tuple[float, np.ndarray]]]:
    """For every interval, its pieces ``(duration, indices of the intervals open then, itself included)``."""
    out = []
    for i in range(len(begin)):
        lo, hi = begin[i], end[i]
        others = np.nonzero((begin < hi) & (end > lo))[0]
        cuts = np.unique(np.clip(np.concatenate([[lo, hi], begin[others], end[others]]), lo, hi))
        pieces = []
        for a, b in zip(cuts[:-1], cuts[1:]):
            mid = (a + b) / 2
            pieces.append((float(b - a), others[(begin[others] <= mid) & (end[others] > mid)]))
        out.append(pieces)
    return out


def _reference(frames: Sequence[pd.DataFrame], start: str) -> pd.Series:
    """Median time by (stage, batch size) over the reference executions, where there are enough of them."""
    ref = pd.concat([f.assign(t=f["end_ms"] - f[start]) for f in frames])
    g = ref.groupby(["stage", "batch_size"])["t"]
    med = g.median()
    return med[g.size() >= MIN_REFERENCE]


def slowdowns(ex: pd.DataFrame, reference: Sequence[pd.DataFrame], start: str = "start_ms") -> pd.DataFrame:
    """Every execution of ``ex`` with its time ``t``, the reference median ``ref``, ``slowdown = t / ref`` (NaN
    without a reference) and ``n_open`` over ``[start, end_ms)``."""
    ref = _reference(reference, start)
    b, e = ex[start].to_numpy(float), ex["end_ms"].to_numpy(float)
    pieces = _open_sets(b, e)
    out = ex[["stage", "batch_size"]].copy()
    out["t"] = e - b
    out["ref"] = [ref.get((int(s), int(k)), np.nan) for s, k in zip(ex["stage"], ex["batch_size"])]
    out["slowdown"] = out["t"] / out["ref"]
    out["n_open"] = [round(sum(dt * len(j) for dt, j in p) / sum(dt for dt, _ in p)) if p else 0 for p in pieces]
    return out


def stretches(ex: pd.DataFrame, gpu_table, share: float = OVERLAP_SHARE_H100) -> pd.DataFrame:
    """For every execution, the device model's stretch of GPU work over ``[begin_ms, end_ms)`` with the others open
    as measured: ``stretch_none`` (fluid) and ``stretch_overlap`` (``contention = "overlap"`` at ``share``)."""
    d = np.array([gpu_table.demand(int(s), int(k)) for s, k in zip(ex["stage"], ex["batch_size"])])
    pieces = _open_sets(ex["begin_ms"].to_numpy(float), ex["end_ms"].to_numpy(float))
    none, over = [], []
    for p in pieces:
        span = sum(dt for dt, _ in p)
        dem = [(dt, float(d[j].sum()), len(j)) for dt, j in p]
        none.append(sum(dt * max(1.0, D) for dt, D, _ in dem) / span if span > 0 else np.nan)
        over.append(sum(dt * max(1.0, D + share * (n - D)) for dt, D, n in dem) / span if span > 0 else np.nan)
    return pd.DataFrame({"stretch_none": none, "stretch_overlap": over}, index=ex.index)


def _simulated(folder: Path, references: Sequence[Path], table: Path, engine: Path, contention: str,
               share: float) -> pd.DataFrame:
    """The case and its references simulated with the fitted engine: the case's slowdowns by its own rule."""
    from dvasim.api import run
    from dvasim.fitting.check import case_config

    def timeline(d: Path, model: str) -> pd.DataFrame:
        cfg = case_config(d, table)
        cfg["engine"] = {**cfg.get("engine", {}), "contention": model}
        if model == "overlap":
            cfg["engine"]["contention_share"] = share
        return run(cfg, engine=engine, progress=False, timeline=1_000_000).extra["timeline"]

    refs = [timeline(d, "none") for d in references]  # one stage at a time: no contention to model
    return slowdowns(timeline(folder, contention), refs)


def _by_open(df: pd.DataFrame, cols: Sequence[str]) -> pd.DataFrame:
    ok = df.dropna(subset=["slowdown"])
    g = ok.groupby("n_open")
    out = pd.DataFrame({"n": g.size(), "time_share": df.groupby("n_open")["t"].sum() / df["t"].sum()})
    for c in cols:
        out[f"{c}_p25"] = g[c].quantile(0.25)
        out[c] = g[c].median()
        out[f"{c}_p75"] = g[c].quantile(0.75)
    return out


def check(case: str | Path = REPLAYS / "resnet152_dvabatch_0.6", share: float = OVERLAP_SHARE_H100,
          simulate: bool = True) -> dict[str, Any]:
    """The check on ``case`` (a replay folder ``<model>_<policy>_<load>`` beside its model's ZeroBatch folders,
    GPU table and serving table): ``measured`` (medians and quartiles by ``n_open``: the slowdown over
    ``[start, end)``, over ``[begin, end)`` as ``compute``, and the model's stretches), ``sim_none`` and
    ``sim_overlap`` (the simulated case by ``n_open``; without ``simulate``, not run) and ``overall`` medians."""
    from dvasim.fitting.logs import read_replay
    from dvasim.model.table import LatencyTable

    folder = Path(case)
    model = folder.name.split("_")[0] if not folder.name.startswith("bert_base") else "bert_base"
    refs = sorted(folder.parent.glob(f"{model}_zerobatch_*"))
    ex = read_replay(folder)["executions"]
    ref_ex = [read_replay(d)["executions"] for d in refs]
    m = slowdowns(ex, ref_ex)
    m["compute"] = slowdowns(ex, ref_ex, start="begin_ms")["slowdown"]
    m = m.join(stretches(ex, LatencyTable.load(folder.parent / f"{model}_gpu_table.csv"), share))
    cols = ["slowdown", "compute", "stretch_none", "stretch_overlap"]
    out: dict[str, Any] = {"case": folder.name, "share": share, "measured": _by_open(m, cols),
                           "overall": m[cols].median().to_dict()}
    if simulate:
        table, engine = folder.parent / f"{model}_serving_table.csv", ENGINES / f"engine_{model}_gputable.toml"
        for c in ("none", "overlap"):
            s = _simulated(folder, refs, table, engine, c, share)
            out[f"sim_{c}"] = _by_open(s, ["slowdown"])
            out["overall"][f"sim_{c}"] = float(s["slowdown"].median())
    return out


def _fmt(df: pd.DataFrame) -> str:
    return df.to_string(float_format=lambda x: f"{x:.2f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--case", default=str(REPLAYS / "resnet152_dvabatch_0.6"))
    p.add_argument("--share", type=float, default=OVERLAP_SHARE_H100)
    p.add_argument("--no-sim", action="store_true", help="leave out the simulated case")
    a = p.parse_args(argv)
    res = check(a.case, a.share, simulate=not a.no_sim)
    print(f"{res['case']}: contention_share {res['share']}; by executions open (n_open, itself included)")
    print("measured slowdown ([start, end) and compute [begin, end)) and the device model's stretch of GPU work:")
    print(_fmt(res["measured"]))
    for c in ("none", "overlap"):
        if f"sim_{c}" in res:
            print(f"simulated case (fitted engine, GPU table), contention = {c!r}:")
            print(_fmt(res[f"sim_{c}"]))
    print("medians over all executions: " + ", ".join(f"{k} {v:.2f}" for k, v in res["overall"].items()))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
