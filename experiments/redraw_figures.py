"""Redraw the committed figures from the committed CSVs, without running anything again: each script's own plot
function on the CSV it wrote (so the numbers drawn are the committed ones, bit for bit), and ``dvasim compare``'s
three figures (:func:`dvasim.reporting.plots.policy_bars`, :func:`~dvasim.reporting.plots.attribution_bars`) on
``compare.csv`` and ``attribution.csv``. For a change of drawing only (issue 37's figures); a change of results
reruns the scripts.

Redrawn, in ``experiments/results`` and ``experiments/results/gpu-only``: Figures 15, 17-21, E2bird's 13-14,
LazyBatching's 12-15, the compare figures (also ``tfserving/compare``), Table 5's strategies (``table5``), the
characterization study's figures (``study``: ``study_fig9_window``, ``study_maxbs``, ``study_fig10`` / ``fig12`` /
``fig13`` / ``fig15``), ``tcomp_wait_sweep`` (``tcomp``) and ``stack_question``. The paper rerun's Figures 15 and
17-21 are redrawn from the CSVs committed beside them by naming their folders:

    .venv/bin/python experiments/redraw_figures.py [--results DIR ...] [--only NAME ...]
    .venv/bin/python experiments/redraw_figures.py --results experiments/results/paper_rerun/*/figures
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

COMPARE_DEVICE = "titanrtx"  # dvasim compare's default device, the committed comparisons'


def _fig15(d: Path) -> None:
    import fig15_stepping as f

    f.plot_stepping(pd.read_csv(d / "fig15_queries.csv.gz"), d / "fig15_stepping.png")
    f.plot_peaks(pd.read_csv(d / "fig15_peaks.csv"), d / "fig15_peaks.png")


def _simple(module: str, csv: str, png: str):
    def draw(d: Path) -> None:
        mod = __import__(module)
        mod.plot(pd.read_csv(d / csv), d / png)

    return draw


def _e2bird(d: Path) -> None:
    import e2bird_figs13_14 as f

    caps = pd.read_csv(d / "e2bird_fig14_capacity.csv")
    stack = str(caps["stack"].iloc[0])
    f.plot14(caps, d / "e2bird_fig14_capacity.png", stack)
    f.plot13(pd.read_csv(d / "e2bird_fig13_queries.csv"), d / "e2bird_fig13.png", stack)


def _lazyb(d: Path) -> None:
    import lazyb_figs12_15 as f

    t = {k: pd.read_csv(d / f"lazyb_{k}.csv") for k in ("fig12", "fig13", "fig14", "fig15")}
    models = list(dict.fromkeys(t["fig12"]["model"]))
    f._plots(d, models, t["fig12"], t["fig13"], t["fig14"], t["fig15"], str(t["fig12"]["stack"].iloc[0]))


def _compare(d: Path) -> None:
    """The figures ``dvasim compare`` draws (dvasim.studies.compare.compare_figures), from its CSVs."""
    from dvasim.reporting import plots
    from dvasim.studies.compare import compare_figures

    c = d / "compare"
    att = pd.read_csv(c / "attribution.csv") if (c / "attribution.csv").exists() else None
    for name, args, kw in compare_figures(pd.read_csv(c / "compare.csv"), att, c, COMPARE_DEVICE):
        getattr(plots, name)(*args, **kw)


def _table5(d: Path) -> None:
    import table5_strategies as f

    f.plot(pd.read_csv(d / "table5_strategies.csv"), d / "table5_strategies.png")


def _study(d: Path) -> None:
    import study_maxbs
    import study_slicing as sl
    import study_window

    study_window.plot(pd.read_csv(d / "study_fig9_window.csv"), d / "study_fig9_window.png")
    study_maxbs.plot(pd.read_csv(d / "study_maxbs.csv"), d / "study_maxbs.png")
    sl.plot_lines(pd.read_csv(d / "study_fig10_slice_position.csv"), "ratio", "capacity_qps",
                  d / "study_fig10_slice_position.png", sl.FIG10_TITLE)
    sl.plot_lines(pd.read_csv(d / "study_fig12_stages.csv"), "stages", "capacity_qps", d / "study_fig12_stages.png",
                  sl.FIG12_TITLE, style="launch_overhead_ms")
    sl.plot_micro(pd.read_csv(d / "study_fig13_split.csv"), d / "study_fig13_split.png", "split")
    sl.plot_micro(pd.read_csv(d / "study_fig15_stretch.csv"), d / "study_fig15_stretch.png", "stretch")


def _tcomp(d: Path) -> None:
    import tcomp_wait_sweep as f

    for suffix in ("", "_window"):
        if (d / f"tcomp_wait_sweep{suffix}.csv").exists():
            qos = d / f"tcomp_wait_qos{suffix}.csv"
            f.plot(pd.read_csv(d / f"tcomp_wait_sweep{suffix}.csv"), d / f"tcomp_wait_sweep{suffix}.png",
                   pd.read_csv(qos) if qos.exists() else None)


def _stack_question(d: Path) -> None:
    import stack_question as f

    f.plot(pd.read_csv(d / "stack_question.csv"), d / "stack_question.png")


FIGURES = {
    "fig15": _fig15,
    "fig17": _simple("fig17_glue", "fig17_glue.csv", "fig17_glue.png"),
    "fig18": _simple("fig18_split", "fig18_split_mean.csv", "fig18_split.png"),
    "fig19": _simple("fig19_buffer_pairs", "fig19_buffer_pairs.csv", "fig19_buffer_pairs.png"),
    "fig20": _simple("fig20_stages", "fig20_stages.csv", "fig20_stages.png"),
    "fig21": _simple("fig21_closed_loop", "fig21_closed_loop.csv", "fig21_closed_loop.png"),
    "e2bird": _e2bird,
    "lazyb": _lazyb,
    "compare": _compare,
    "table5": _table5,
    "study": _study,
    "tcomp": _tcomp,
    "stack_question": _stack_question,
}


def main(argv=None) -> list[tuple[str, float]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, nargs="+", default=None,
                   help="results folders (default: experiments/results, its gpu-only/ and tfserving/)")
    p.add_argument("--only", nargs="+", choices=list(FIGURES), default=None)
    args = p.parse_args(argv)
    dirs = args.results or [common.RESULTS, common.RESULTS / "gpu-only", common.RESULTS / "tfserving"]
    done = []
    for d in dirs:
        for name in args.only or FIGURES:
            if name != "compare" and not any(d.glob(f"{name}*.csv*")) and not any(d.glob(f"{name}_*.csv")):
                continue
            if name == "compare" and not (d / "compare" / "compare.csv").exists():
                continue
            t0 = time.perf_counter()
            FIGURES[name](d)
            done.append((f"{d.name}/{name}", time.perf_counter() - t0))
            print(f"{d}: {name} redrawn in {done[-1][1]:.1f} s", flush=True)
    return done


if __name__ == "__main__":
    main()
