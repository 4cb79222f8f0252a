"""Figure 20 (paper §8.7): BertBase, LinkNet and ResNet152 sliced into 1..20 stages: DVABatch's peak throughput
and mean latency, on the serving stack ``--stack``.

The slicing is the simulator's time-even slicing of the per-operator tables (a stage costs the sum of its
operators; slicing breaks no kernel fusion). What more stages cost depends on the stack:

* on a stack with a launch model (the default, ``triton-tensorrt``: ``launch_fixed_ms`` = 0.29 / 4 ms per stage
  launch, DVABatch §8.8's closed-loop overhead spread over ResNet152's four stages, plus 5 us per operator),
  every stage execution pays that launch on a host core while the GPU runs it; nothing is added on top (by
  default ``--overheads 0``): the stack's launch cost *is* the paper's §8.8 overhead, and adding 0.29 ms per
  stage as well would count it twice;
* on ``gpu-only`` (no host cost of any kind) the only cost of a stage is ``[engine] launch_overhead_ms``, a
  host-side delay before every stage execution during which that executor waits but the GPU may run other
  stages; by default it is run at 0.29 ms (the paper's measured scheduling overhead, §8.8, used as a per-stage
  cost, as in the runs before serving stacks) and at 0 ms.

``launch_overhead_ms`` in the CSV is that engine delay, *added to* the stack's own costs.

Mean latency is measured twice per point (Poisson, ``--queries`` queries): at a fixed load, 9/10 of DVABatch's
peak at the model's default stage count (``fixed``; the same offered load for every stage count), and at 9/10
of the point's own peak (``own``).

Size (to keep the run near ten minutes on a shared 2-core machine): the stepping ladder has the paper's 16
levels but ``--step-queries`` (default 1000, the paper's is 2000) queries per level, stopped at the first level
at or above 1.5x the default-stage peak; 3 bisection steps of 2000 queries (resolution about 4 %).

Writes ``fig20_stages.csv`` and ``fig20_stages.png``.

    .venv/bin/python experiments/fig20_stages.py [--quick] [--out DIR] [--calib-from fig15_peaks.csv] [--stack NAME]
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from dvasim.server.stacks import STACKS  # noqa: E402
from dvasim.studies.compare import stack_title  # noqa: E402  (" [stack: NAME]" for a figure title)

PAPER_BEST = {"bert_base": 2, "linknet": 4, "resnet152": 4}  # §8.7


def main(argv=None) -> dict[str, pd.DataFrame]:
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--stages", type=int, nargs="+", default=None, help="stage counts (default 1 2 3 4 6 8 12 16 20)")
    p.add_argument("--overheads", type=float, nargs="+", default=None,
                   help="[engine] launch_overhead_ms values, added to the stack's own launch cost (default: 0 "
                        "on a stack with a launch model, e.g. triton-tensorrt; 0.29 and 0 on gpu-only)")
    p.add_argument("--step-queries", type=int, default=1000, help="queries per stepping level (full mode)")
    p.add_argument("--queries", type=int, default=None, help="queries per latency run (default 2000; quick 300)")
    args = common.parse(p, argv)
    models = args.models or (["resnet152"] if args.quick else ["bert_base", "linknet", "resnet152"])
    stages = args.stages or ([1, 2, 4] if args.quick else [1, 2, 3, 4, 6, 8, 12, 16, 20])
    stacks = {m: common.stack_label(m, args.stack) for m in models}
    n = args.queries or (300 if args.quick else 2000)
    calib = common.read_calib(args.calib_from, stacks)
    clock = common.Stopwatch()
    rows = []
    for model in models:
        stack = stacks[model]
        overheads = args.overheads or default_overheads(stack)
        c = common.calib_for(model, calib, quick=args.quick, seed=args.seed, stack=args.stack)
        ref = c["peak_dvabatch"]
        fixed = 0.9 * ref
        for ov in overheads:
            for st in stages:
                kw = {"stages": st, "engine": {"launch_overhead_ms": ov}, "stack": args.stack}
                if args.quick:
                    pk = common.peak(model, {"name": "dvabatch"}, quick=True, seed=args.seed, **kw)
                else:
                    pk = peak_reduced(model, args.step_queries, cap=1.5 * ref, seed=args.seed, **kw)
                own = 0.9 * pk.peak_qps
                a = common.poisson(model, {"name": "dvabatch"}, fixed, n, seed=1, **kw)
                b = common.poisson(model, {"name": "dvabatch"}, own, n, seed=1, **kw)
                rows.append({"model": model, "stack": a["stack"], "launch_overhead_ms": ov,
                             "stage_cost": cost_label(stack, ov), "stages": st, "peak_qps": pk.peak_qps,
                             "fixed_qps": fixed, "mean_latency_fixed_ms": a["mean_latency_ms"],
                             "p99_latency_fixed_ms": a["p99_latency_ms"], "qos_violation_fixed": a["qos_violation_rate"],
                             "own_qps": own, "mean_latency_own_ms": b["mean_latency_ms"],
                             "p99_latency_own_ms": b["p99_latency_ms"], "n_split_fixed": a["n_split"],
                             "n_stretch_fixed": a["n_stretch"], "peak_wall_s": pk.wall_s,
                             "peak_at_ladder_top": pk.at_ladder_top})
                print(f"{model} [{stack}] overhead {ov} stages {st}: peak {pk.peak_qps:.1f}, mean latency "
                      f"{a['mean_latency_ms']:.2f} ms at {fixed:.0f} QPS  [{clock}]", flush=True)
    df = pd.DataFrame(rows)
    best = []
    for (model, stack, ov), g in df.groupby(["model", "stack", "launch_overhead_ms"], sort=False):
        best.append({"model": model, "stack": stack, "launch_overhead_ms": ov,
                     "best_stages_peak": int(g.loc[g["peak_qps"].idxmax(), "stages"]),
                     "best_stages_latency_fixed": int(g.loc[g["mean_latency_fixed_ms"].idxmin(), "stages"]),
                     "paper_best": PAPER_BEST.get(model)})
    best = pd.DataFrame(best)
    common.save(df, args.out, "fig20_stages.csv")
    plot(df, args.out / "fig20_stages.png")
    common.show(df[["model", "stack", "launch_overhead_ms", "stages", "peak_qps", "mean_latency_fixed_ms",
                    "mean_latency_own_ms"]],
                f"Figure 20: DVABatch peak (QPS) and mean latency (ms) by stage count{stack_title(df)}")
    common.show(best, "best stage count")
    print(f"total {clock}")
    return {"stages": df, "best": best}


def default_overheads(stack: str) -> list[float]:
    """The extra per-launch delays run by default: none on a stack with a launch model (its launch cost is the
    paper's §8.8 overhead already); 0.29 ms and 0 on a stack with no host cost (``gpu-only``)."""
    return [common.LAUNCH_OVERHEAD_MS, 0.0] if STACKS[stack].adds_nothing else [0.0]


def cost_label(stack: str, ov: float) -> str:
    """What a stage launch costs in a run: the legend's words."""
    if STACKS[stack].adds_nothing:
        return f"launch overhead {ov:g} ms per stage"
    st = STACKS[stack]
    own = f"{stack}'s launch ({st.launch_fixed_ms:g} ms + {1000 * st.launch_per_op_ms:g} us/op)"
    return own if ov == 0 else f"{own} + {ov:g} ms per stage"


def peak_reduced(model, step_queries, cap, seed=0, **kw) -> common.Peak:
    """:func:`common.peak` with ``step_queries`` per level (same 16 levels) and 3 bisections of 2000 queries."""
    return common.peak(model, {"name": "dvabatch"}, cap_qps=cap, seed=seed, refine=3, refine_queries=2000,
                       step_queries=step_queries, **kw)


def plot(df: pd.DataFrame, path: Path) -> None:
    """Peak throughput (top row) and mean latency at a fixed load (bottom row, log) against the number of stages,
    one column per model, one line per launch overhead; one legend under the panels."""
    plt, sns = common.plt_sns()
    models = list(dict.fromkeys(df["model"]))
    fig, axes = plt.subplots(2, len(models), figsize=(4.6 * len(models), 6.4), squeeze=False, sharex="col")
    overheads = list(dict.fromkeys(df["stage_cost"]))
    colours = dict(zip(overheads, sns.color_palette("dark", len(overheads))))
    for col, model in enumerate(models):
        d = df[df["model"] == model]
        stages = sorted(d["stages"].unique())
        for ov, g in d.groupby("stage_cost", sort=False):
            kw = {"color": colours[ov], "ls": "-" if g["launch_overhead_ms"].iloc[0] > 0 else ":", "marker": "o",
                  "label": ov}
            axes[0, col].plot(g["stages"], g["peak_qps"], **kw)
            axes[1, col].plot(g["stages"], g["mean_latency_fixed_ms"], **kw)
        axes[0, col].set(title=f"{model}, {common.context(d)}", ylabel="peak throughput (QPS)")
        axes[1, col].set(xlabel="stages", ylabel="mean latency at a fixed load (ms)", yscale="log")
        for ax in axes[:, col]:
            ax.set_xscale("log")
            ax.set_xticks(stages)
            ax.set_xticklabels([str(s) for s in stages])
            ax.minorticks_off()
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
