"""How real stage executions slowed each other down in the replays of the fidelity matrix.

For every execution in ``results/validation/<case>/replay_*/executions.csv`` (written by run_matrix.py) it
computes how many *other* executions ran during it (time-weighted), and compares its measured computation time
with the table's standalone time: where the case was validated with a fresh table (``stage_table.csv``), the
stage module's time (``compute_ms - copy_ms``) against that table, else ``compute_ms`` (with the buffer copies)
against the shipped table (``table_ms``). Executions are grouped by the number of others that overlapped them for at
least 90% of their duration (0 = alone, 1 = one partner, 2 = two partners):

* the *alone* ratio says how well the CPU table predicts a lone execution (copies and table error);
* the *one partner* ratio divided by the alone ratio is the co-run slowdown of two executions on the two cores
  (``[engine] corun_slowdown`` for ``sharing = "parallel"``);
* with *two partners* three single-threaded executions share two cores, which ``"parallel"`` cannot express.

    .venv/bin/python experiments/validation/analyze_sharing.py [--runs-dir results/validation] [--only unet]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]


def overlap_profile(ex: pd.DataFrame) -> pd.DataFrame:
    """Adds ``others`` (time-weighted mean number of other executions running) and ``others_90`` (the number
    of others present during at least 90% of the execution, by the dominant level)."""
    b = ex["begin_ms"].to_numpy()
    e = ex["end_ms"].to_numpy()
    events = sorted([(t, 1) for t in b] + [(t, -1) for t in e])
    times = np.array([t for t, _ in events])
    level = np.cumsum([d for _, d in events])  # running executions after each event
    mean_others, dominant = [], []
    for bi, ei in zip(b, e):
        lo, hi = np.searchsorted(times, bi, "right"), np.searchsorted(times, ei, "left")
        pts = np.concatenate([[bi], times[lo:hi], [ei]])
        lev = np.concatenate([[level[lo - 1] if lo else 1], level[lo:hi]])
        dur = np.diff(pts)
        total = dur.sum()
        if total <= 0:
            mean_others.append(0.0)
            dominant.append(-1)
            continue
        others = np.maximum(lev - 1, 0)
        mean_others.append(float((others * dur).sum() / total))
        shares = {k: dur[others == k].sum() / total for k in np.unique(others)}
        k, sh = max(shares.items(), key=lambda kv: kv[1])
        dominant.append(int(k) if sh >= 0.9 else -1)
    out = ex.copy()
    out["others"] = mean_others
    out["others_90"] = dominant
    out["ratio"] = out["compute_ms"] / out["table_ms"]
    return out


def with_fresh_table(ex: pd.DataFrame, table_csv: Path) -> pd.DataFrame:
    """Replace ``table_ms`` by the case's freshly profiled per-stage table (``stage_table.csv``), and measure
    the stage alone (``compute_ms`` without the buffer copies)."""
    from dvasim.calibration.table import LatencyTable

    t = LatencyTable.load(table_csv)
    tok = t.seq_lens is not None
    ex = ex.copy()
    ex["table_ms"] = [t.latency(s, b, L) if tok else t.latency(s, b)
                      for s, b, L in zip(ex["stage"], ex["batch_size"], ex["seq_len"])]
    ex["compute_ms"] = ex["compute_ms"] - ex["copy_ms"]
    return ex


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs-dir", default=str(ROOT / "results" / "validation"))
    ap.add_argument("--only", default=None)
    args = ap.parse_args()
    frames = []
    for f in sorted(Path(args.runs_dir).glob("*/replay_*/executions.csv")):
        case = f.parent.parent.name
        if args.only and args.only not in case:
            continue
        ex = pd.read_csv(f)
        fresh = f.parent.parent / "stage_table.csv"
        if fresh.is_file():
            ex = with_fresh_table(ex, fresh)
        d = overlap_profile(ex)
        d["case"] = case
        d["model"] = case.rsplit("_", 2)[0]
        frames.append(d)
    if not frames:
        print("no executions.csv found; run run_matrix.py first")
        return
    df = pd.concat(frames)
    df = df[df["others_90"] >= 0]
    g = df.groupby(["model", "others_90"])["ratio"].agg(["median", "mean", "count"]).round(3)
    print("measured / table time, by the number of executions running alongside (>= 90% of the time):")
    print(g.to_string())
    for m, d in df.groupby("model"):
        a = d.loc[d["others_90"] == 0, "ratio"].median()
        two = d.loc[d["others_90"] == 1, "ratio"].median()
        three = d.loc[d["others_90"] == 2, "ratio"].median()
        print(f"{m}: alone {a:.3f}, co-run slowdown (one partner / alone) {two / a:.3f}, "
              f"two partners / alone {three / a:.3f} (per-core model: {1.5 * two / a:.3f})")


if __name__ == "__main__":
    main()
