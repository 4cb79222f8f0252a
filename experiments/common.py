"""Shared helpers of the figure scripts (``experiments/fig*.py``): argument parsing, a peak-throughput search that
can stop the stepping load early, DelayBatch window tuning, Poisson runs, and writing CSV / PNG / tables. The
figures take their colours, SLO marks and axis words from :mod:`dvasim.reporting.plots` (``common.PALETTE``,
``common.policy_colours``, ``common.slo_line``, ``common.readable``): a policy has one colour in every figure.

Every script has ``main(argv) -> dict[str, pandas.DataFrame]`` and the same options:

* ``--quick``: a small, fast version (short stepping levels, one or two bisection steps, few queries, a subset
  of the models) used by ``tests/test_experiments_smoke.py``;
* ``--out DIR``: where the CSVs and PNGs go (default ``results/experiments`` in the working directory, so a rerun
  never overwrites the committed results; ``--out experiments/results`` regenerates those);
* ``--calib-from CSV``: take each model's tuned DelayBatch window and peak throughputs from a previous
  ``fig15_peaks.csv`` instead of recomputing them (``--window-from`` is an alias).

Runs are sequential (one worker process): the machines these were run on are shared.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

# the figures' shared helpers, one set for the command line, the scripts and the notebooks: the panel grid, the one
# colour per policy (PALETTE, policy_colours), the SLO line labelled off the data, words for raw column names
from dvasim.reporting.plots import (  # noqa: F401
    PALETTE,
    SLO_COLOUR,
    STRATEGY_COLOURS,
    axis_note,
    bar_verdict,
    describe,
    device_name,
    mark_groups,
    mark_verdicts,
    model_panels,
    policy_colour,
    policy_colours,
    rates_words,
    readable,
    row_verdict,
    slo_line,
    verdict_legend,
)
from dvasim.studies import evaluation as study

RESULTS = Path(__file__).resolve().parent / "results"  # the committed results
DEFAULT_OUT = Path("results") / "experiments"  # where a run writes unless told otherwise
ALL_MODELS = tuple(study.MODELS)
LAUNCH_OVERHEAD_MS = 0.29  # the paper's measured scheduling overhead (§8.8)

# the quick stepping load: the same 16 geometric levels (66 .. 4000 QPS) as the paper's, 250 queries per level
QUICK_STEPPING = {"start_qps": 66.0, "end_qps": 4000.0, "step_queries": 250, "n_queries": 4000}


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="small fast version (smoke test)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help="output directory (default: results/experiments; the committed results are in "
                        "experiments/results)")
    p.add_argument("--calib-from", "--window-from", dest="calib_from", type=Path, default=None,
                   help="fig15_peaks.csv giving each model's tuned DelayBatch window (and peaks)")
    p.add_argument("--models", nargs="+", default=None, help="subset of the models")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dva", choices=("dvabatch", "dvabatch-built"), default="dvabatch",
                   help="which DVABatch the script's runs of it are: as the paper describes it (dvabatch, default) "
                        "or as its authors' backend runs it (dvabatch-built; see dva_policy)")
    p.add_argument("--stack", default=None,
                   help="the serving stack every run simulates (dvasim stacks lists them; default: the one the "
                        "tables imply, the paper's own: triton-tensorrt-21.10 for the Titan RTX tables, triton-tensorrt for the A100's); "
                        "gpu-only for the GPU alone")
    return p


def parse(p: argparse.ArgumentParser, argv) -> argparse.Namespace:
    args = p.parse_args(argv)
    if getattr(args, "stack", None) is not None:
        from dvasim.server.resolve import stack_by_name

        stack_by_name(args.stack, "--stack")  # one line naming --stack if unknown
    args.out = Path(args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    DVA["system"] = getattr(args, "dva", "dvabatch")
    if getattr(args, "quick", False):
        # a quick run is a smoke test: short loads and few queries, not the paper's setup; say so wherever its
        # numbers appear (printed tables, and a marker next to its files)
        QUICK["on"] = True
        print(QUICK_BANNER)
        (args.out / "QUICK_RUN.txt").write_text(QUICK_BANNER + "\n")
    return args


QUICK_BANNER = ("[quick run: a smoke test with short loads and few queries; its numbers are not comparable with the "
                "paper's or with the full runs in experiments/results]")


# ----------------------------------------------------------------------------- which DVABatch
DVA = {"system": "dvabatch"}  # set by parse() from --dva


def dva_policy(policy: dict[str, Any]) -> dict[str, Any]:
    """A script's DVABatch policy as the ``--dva`` system runs it. ``dvabatch`` (as described): unchanged.
    ``dvabatch-built`` (as its authors built it, :mod:`dvasim.policies.dvabatch_built`): ``dvabatch`` becomes
    ``dvabatch-built`` with the same Triton window and batch limit (its scheduler the paper's for the model),
    ``dvabatch-split`` (Figure 18's split only) the OPERATOR_DVA scheduler with stretch off
    (``max_allow_merge_stage = 0``); every other policy is unchanged."""
    name = policy.get("name")
    if DVA["system"] == "dvabatch" or name not in ("dvabatch", "dvabatch-split"):
        return policy
    out = {"name": "dvabatch-built", **{k: policy[k] for k in ("max_queue_delay_ms", "max_batch_size") if k in policy}}
    if name == "dvabatch-split":
        out.update(scheduler="OPERATOR_DVA", max_allow_merge_stage=0)
    return out


def make_config(model: str, policy: dict[str, Any], workload: dict[str, Any], **cfg_kw) -> dict[str, Any]:
    """:func:`dvasim.studies.evaluation.make_config` with the ``--dva`` system's DVABatch (:func:`dva_policy`)."""
    return study.make_config(model, dva_policy(policy), workload, **cfg_kw)


# ----------------------------------------------------------------------------- peak throughput
@dataclass
class Peak:
    peak_qps: float
    bracket: tuple[float, float]
    levels: pd.DataFrame
    stepping: pd.DataFrame
    probes: list[tuple[float, float, bool]]
    wall_s: float

    @property
    def at_ladder_top(self) -> bool:
        """Every stepping level, up to the top (4,000 QPS), was within QoS: the peak is only a lower bound."""
        return not math.isfinite(self.bracket[1])


def ladder(quick: bool, step_queries: int | None = None) -> dict[str, Any]:
    """The full stepping load: the paper's (``study.STEPPING``), or the quick one; ``step_queries`` changes the
    queries per level and keeps the levels."""
    full = dict(QUICK_STEPPING if quick else study.STEPPING)
    if step_queries is not None:
        n_levels = -(-full["n_queries"] // full["step_queries"])
        full.update(step_queries=int(step_queries), n_queries=n_levels * int(step_queries))
    return full


def stepping_spec(quick: bool, cap_qps: float | None = None, step_queries: int | None = None) -> dict[str, Any]:
    """The stepping load, truncated after the first level at or above ``cap_qps`` (same levels, same seeds:
    ``stepping_rates`` with ``end_qps`` = that level and ``n_queries`` = the levels kept gives the same ladder,
    and the arrival stream is a prefix of the full one)."""
    full = ladder(quick, step_queries)
    if cap_qps is None:
        return full
    from dvasim.workload import stepping_rates

    levels = np.unique(stepping_rates(**full))
    k = int(np.searchsorted(levels, cap_qps))  # first level >= cap
    if k >= len(levels) - 1:
        return full
    return {**full, "end_qps": float(levels[k]), "n_queries": (k + 1) * full["step_queries"]}


def peak(model: str, policy: dict[str, Any], *, quick: bool = False, cap_qps: float | None = None, seed: int = 0,
         refine: int | None = None, refine_queries: int | None = None, step_queries: int | None = None,
         **cfg_kw) -> Peak:
    """Peak throughput as :func:`dvasim.studies.evaluation.peak_throughput` defines it (the highest offered rate whose p99 stays
    within the QoS target: stepping bracket, then bisection at constant-rate Poisson loads).

    ``cap_qps`` stops the stepping load after the first level at or above it (the later levels are all above the
    bracket); if every level kept is within QoS the full ladder is run instead. ``quick`` uses 250 queries per
    level, one bisection step of 1,000 queries. ``step_queries`` changes the queries per stepping level (same
    levels)."""
    from dvasim.workload import stepping_rates

    t0 = time.perf_counter()
    refine = (1 if quick else 4) if refine is None else refine
    refine_queries = (1000 if quick else 4000) if refine_queries is None else refine_queries
    spec = stepping_spec(quick, cap_qps, step_queries)
    while True:
        wl = {"kind": "stepping", "seed": seed, **spec}
        res = study.run_config(make_config(model, policy, wl, **cfg_kw))
        rates = stepping_rates(**spec)
        df = res.queries.assign(offered_qps=rates)
        levels = study.level_stats(df, rates)
        lo, hi = study.stepping_bracket(levels)
        full = ladder(quick, step_queries)
        if math.isfinite(hi) or spec == full:
            break
        spec = full  # the cap was too low: run the whole ladder
    probes = []
    if math.isfinite(hi):
        for k in range(refine):
            mid = math.sqrt(max(lo, 1.0) * hi) if lo > 0 else hi / 2
            wl = {"kind": "poisson", "rate_qps": mid, "n_queries": refine_queries, "seed": seed + 1 + k}
            r = study.run_config(make_config(model, policy, wl, **cfg_kw))
            p99 = float(np.percentile(r.queries["latency_ms"].fillna(np.inf).to_numpy(), 99))
            ok = p99 <= study.QOS_MS
            probes.append((mid, p99, ok))
            lo, hi = (mid, hi) if ok else (lo, mid)
    return Peak(lo, (lo, hi), levels, df, probes, time.perf_counter() - t0)


def tune_window(model: str, *, quick: bool = False, windows=None, cap_qps: float | None = None,
                **cfg_kw) -> pd.DataFrame:
    """DelayBatch's peak per window (``study.window_candidates`` unless given); ``best`` marks the highest peak
    (ties: the smaller window), as :func:`dvasim.studies.evaluation.tune_delaybatch` chooses."""
    if windows is None:
        windows = study.window_candidates(model, cfg_kw.get("device", "titanrtx"))
        if quick:
            windows = windows[1:3]
    rows = []
    for w in windows:
        p = peak(model, {"name": "delaybatch", "max_queue_delay_ms": w}, quick=quick, cap_qps=cap_qps, **cfg_kw)
        rows.append({"model": model, "max_queue_delay_ms": float(w), "peak_qps": p.peak_qps})
    df = pd.DataFrame(rows)
    best = df.sort_values(["peak_qps", "max_queue_delay_ms"], ascending=[False, True]).index[0]
    df["best"] = df.index == best
    return df


def read_calib(path: Path | None, stacks: dict[str, str] | None = None) -> pd.DataFrame | None:
    """A ``fig15_peaks.csv`` indexed by model. ``stacks`` (model -> the stack this run serves it on): refuse, in
    one line, a CSV whose ``stack`` column names another stack for one of them (its windows and peaks were
    found on another server)."""
    if path is None:
        return None
    df = pd.read_csv(path)
    if "model" not in df or "delaybatch_window_ms" not in df:
        raise SystemExit(f"{path}: expected columns model, delaybatch_window_ms (a fig15_peaks.csv)")
    if stacks and "stack" in df:
        for model, st in zip(df["model"], df["stack"]):
            if model in stacks and st != stacks[model]:
                raise SystemExit(f"{path}: {model} was calibrated on stack {st!r}, this run serves it on "
                                 f"{stacks[model]!r}; give the fig15_peaks.csv of that stack (--calib-from)")
    return df.set_index("model")


def calib_for(model: str, calib: pd.DataFrame | None, *, quick: bool, seed: int = 0, **cfg_kw) -> dict[str, float]:
    """``{"window": tuned DelayBatch window, "peak_delaybatch": its peak, "peak_dvabatch": DVABatch's peak}``,
    from the calibration CSV when it has the model, else computed (with ``cfg_kw``, e.g. ``stack=``, passed to
    every run)."""
    if calib is not None and model in calib.index:
        row = calib.loc[model]
        out = {"window": float(row["delaybatch_window_ms"])}
        for k in ("peak_delaybatch", "peak_dvabatch"):
            col = f"{k.replace('peak_', 'peak_qps_')}"
            if col in row and pd.notna(row[col]):
                out[k] = float(row[col])
        if len(out) == 3:
            return out
    else:
        tuned = tune_window(model, quick=quick, seed=seed, **cfg_kw)
        out = {"window": float(tuned.loc[tuned["best"], "max_queue_delay_ms"].iloc[0])}
        out["peak_delaybatch"] = float(tuned.loc[tuned["best"], "peak_qps"].iloc[0])
    if "peak_delaybatch" not in out:
        out["peak_delaybatch"] = peak(model, delaybatch(out["window"]), quick=quick, seed=seed, **cfg_kw).peak_qps
    if "peak_dvabatch" not in out:
        out["peak_dvabatch"] = peak(model, {"name": "dvabatch"}, quick=quick, seed=seed,
                                    cap_qps=4 * out["peak_delaybatch"], **cfg_kw).peak_qps
    return out


def stack_label(model: str, stack: str | None = None, device: str = "titanrtx") -> str:
    """The stack a run of ``model`` serves on (``stack``, else the one its table implies), as ``summary["stack"]``
    names it; for the CSVs of runs whose summaries are not kept (peak searches)."""
    from dvasim.studies.compare import stack_of

    return stack_of(model, device, stack)


def delaybatch(window: float) -> dict[str, Any]:
    return {"name": "delaybatch", "max_queue_delay_ms": float(window)}


# ----------------------------------------------------------------------------- constant-rate runs
def poisson(model: str, policy: dict[str, Any], rate_qps: float, n_queries: int, seed: int = 1,
            **cfg_kw) -> dict[str, Any]:
    """Summary of one Poisson run (unfinished queries: NaN latencies are excluded by the summary and counted in
    ``n_completed``)."""
    wl = {"kind": "poisson", "rate_qps": float(rate_qps), "n_queries": int(n_queries), "seed": seed}
    r = study.run_config(make_config(model, policy, wl, **cfg_kw))
    s = r.summary
    return {"stack": s["stack"], "mean_latency_ms": s["mean_latency_ms"], "p99_latency_ms": s["p99_latency_ms"],
            "throughput_qps": s["throughput_qps"], "qos_violation_rate": s["qos_violation_rate"],
            "mean_exit_batch_size": s["mean_exit_batch_size"], "n_stretch": s["n_stretch"],
            "n_split": s["n_split"], "n_completed": s["n_completed"], "n_queries": s["n_queries"]}


# ----------------------------------------------------------------------------- output
def save(df: pd.DataFrame, out: Path, name: str) -> Path:
    path = Path(out) / name
    df.to_csv(path, index=False, float_format="%.6g")
    return path


QUICK = {"on": False}  # set by parse(): every table printed by show() is then labelled as a quick run


def show(df: pd.DataFrame, title: str = "", digits: int = 3) -> None:
    if title:
        print(f"\n== {'[quick] ' if QUICK['on'] else ''}{title}")
    with pd.option_context("display.width", 160, "display.max_columns", 30, "display.max_rows", 200):
        print(df.round(digits).to_string(index=False))


DEVICE = "titanrtx"  # the device of the scripts' runs unless a script says otherwise (study.make_config's)


def context(df: pd.DataFrame | None = None, device: str | None = DEVICE, **parts) -> str:
    """A figure title's words for what was run (:func:`dvasim.reporting.plots.describe`): ``device`` in words and
    the stacks of ``df`` (its ``stack`` column), with ``parts`` (``model=``, ``policy=``, ``load=``)."""
    if "stack" not in parts:
        parts["stack"] = list(df["stack"]) if df is not None and "stack" in df else None
    return describe(device=device_name(device) if device else None, **parts)


def with_verdicts(df: pd.DataFrame, slo_ms: float | None = None, stable: str | None = None) -> pd.DataFrame:
    """``df`` with a ``verdict`` column for the verdict markers (:func:`dvasim.reporting.plots.bar_verdict` of each
    row: a ``stable`` column false or unfinished queries ``unstable``, metastable probes ``metastable``, a p99 over
    ``slo_ms`` ``over-SLO``); ``stable``: the name of the table's stability column when it is not ``stable``."""
    d = df.assign(stable=df[stable]) if stable and stable in df else df.copy()
    d["verdict"] = [bar_verdict(r, slo_ms) for r in d.to_dict("records")]
    return d


def marked_note(ax, counts: dict[str, int], what: str = "marked") -> None:
    """Say above ``ax`` how many points of each verdict :func:`mark_verdicts` marked (nothing when none)."""
    if counts:
        axis_note(ax, f"{what}: " + ", ".join(f"{n} {v}" for v, n in counts.items()))


def side_legend(fig, axes, title: str | None = None, y: float = 0.9):
    """One legend for ``axes`` (every line and marker once, the panels' own legends removed), beside them at the
    right of ``fig``: a legend never sits on the data. Returns it (``None`` when nothing is labelled)."""
    handles, labels = [], []
    for ax in list(getattr(axes, "flat", axes)):
        for h, lb in zip(*ax.get_legend_handles_labels()):
            if lb not in labels and not lb.startswith("_"):
                handles.append(h)
                labels.append(lb)
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    if not handles:
        return None
    return fig.legend(handles, labels, title=title, loc="upper left", bbox_to_anchor=(1.0, y), fontsize=8,
                      title_fontsize=8)


def plt_sns():
    from dvasim.reporting.plots import _plt

    return _plt()




class Stopwatch:
    def __init__(self):
        self.t0 = time.perf_counter()

    def __str__(self) -> str:
        return f"{time.perf_counter() - self.t0:.1f} s"
