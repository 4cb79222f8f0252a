"""The characterization study's model-slicing and meta-operation sweeps (batching-characterization-2024 §5, §6.2,
§6.3): Figure 10 (throughput over the slicing ratio), Figure 12 (throughput over the stage count), Figures 13 and
14 (speedup of *split* over the slicing ratio, for batch sizes and sub-batch counts), Figures 15 and 16 (speedup
of *stretch* over the slicing ratio, and over batch-size combinations).

**Setup** (``dvasim.studies.characterization``): modelled A100 tables, ResNet = ``resnet152``, BERT =
``bert_base`` (length 384), LinkNet = ``linknet``; evenly spaced arrivals; bs_max 64; QoS 200 ms (p99).

* **Figure 10**: two stages cut at slicing ratio r (``[model] ratios = [r, 1 - r]``), strategies I (naive
  batching: no stretch, split or pipelining), II (pipelined execution only) and VIII (stretch + split +
  pipeline), ``policies = []``. Throughput = capacity under the 200 ms p99 (``dvasim.studies.capacity``); also the mean
  latency at a fixed load, 9/10 of strategy VIII's capacity at r = 0.5.
* **Figure 12**: 1 ... 16 time-even stages (the study used PipeDream's equal-time slicing), same strategies and
  measures. The per-stage cost (the study's "synchronization costs between stages") is the stack's: on
  ``triton-tensorrt`` (the default) its launch model, 0.29 / 4 ms per stage launch (DVABatch §8.8) plus 5 us per
  operator, run with nothing added (``launch_overhead_ms`` 0: adding 0.29 ms per stage would count §8.8's number
  twice); on ``gpu-only`` none, so it is run with no per-stage cost and with 0.29 ms per stage launch
  (``[engine] launch_overhead_ms``, DVABatch's measured scheduling overhead), as before serving stacks.
* **Figures 13/14**: one batch of N queries arriving at once, split after Stage_0 into n sub-batches of N/n run one
  after another (``characterization.split_scenario``); speedup = mean latency of naive batching / with split.
  Figure 13: n = 2, N = 4 ... 64; Figure 14: N = 64, n = 2 ... 64.
* **Figures 15/16**: BS_0 has just started Stage_0 when BS_1 arrives (``characterization.stretch_scenario``);
  speedup = mean latency without stretch (naive batching: BS_1 after BS_0; also pipelined) / with stretch.
  Figure 15: BS_0 = BS_1 = N = 1 ... 32; Figure 16: BS_0 x BS_1 in 1 ... 32 at ratio ``--fig16-ratio``.

Every run, the scripted scenarios included, serves on ``--stack`` (default: ``triton-tensorrt``, the stack the
a100 tables imply, the study's Triton + TensorRT; its per-batch host costs and launch model apply); every CSV has
a ``stack`` column.

Writes ``study_fig10_slice_position.csv``, ``study_fig12_stages.csv``, ``study_fig13_split.csv`` (Figure 14's
rows have ``n_sub`` > 2), ``study_fig15_stretch.csv`` (Figure 16's rows have ``figure`` = 16) and one PNG each.

    .venv/bin/python experiments/study_slicing.py [--quick] [--out DIR] [--figures 10 12 13 15] [--stack NAME]
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import dvasim  # noqa: E402
from dvasim.api import load_profile  # noqa: E402
from dvasim.reporting.plots import save_figure  # noqa: E402
from dvasim.server.stacks import STACKS  # noqa: E402
from dvasim.studies import characterization as ch  # noqa: E402
from dvasim.studies.compare import stack_title  # noqa: E402  (" [stack: NAME]" for a figure title)

STAGES = (1, 2, 3, 4, 6, 8, 12, 16)
OVERHEADS = (0.0, 0.29)  # Figure 12's [engine] launch_overhead_ms on a stack with no launch model (gpu-only)
SPLIT_BS = (4, 8, 16, 32, 64)
SPLIT_N = (2, 4, 8, 16, 32, 64)
STRETCH_BS = (1, 2, 4, 8, 16, 32)
FIG10_TITLE = "Figure 10: capacity (p99 <= 200 ms) over the slicing ratio Stage_0 / (Stage_0 + Stage_1)"
FIG12_TITLE = "Figure 12: capacity (p99 <= 200 ms) over the stage count (time-even slicing)"


@functools.lru_cache(maxsize=256)
def profile(model: str, ratio: float | None = None, stages: int | None = None):
    return load_profile(ch.model_cfg(model, ratio=ratio, stages=stages))


@functools.lru_cache(maxsize=256)
def served(model: str, ratio: float | None = None, stages: int | None = None, stack: str | None = None):
    """The serving stack of the scripted scenarios (:func:`dvasim.studies.characterization.served`)."""
    return ch.served(ch.model_cfg(model, ratio=ratio, stages=stages), stack)


def overheads_for(stack: str | None) -> tuple[float, ...]:
    """Figure 12's [engine] launch_overhead_ms values: 0 and 0.29 on a stack with no host cost (gpu-only); only 0
    on one with a launch model, whose launch cost is DVABatch §8.8's 0.29 ms already (spread over 4 stages)."""
    name = served("resnet152", stages=1, stack=stack).label
    return OVERHEADS if STACKS[name].adds_nothing else (0.0,)


def throughput_point(model: str, section: dict, label: str, load_qps: float, n: int, quick: bool,
                     overhead: float = 0.0, stack: str | None = None) -> dict:
    pol = ch.strategy_policy(label)
    cap, top = ch.capacity_qps(ch.config(section, pol, ch.workload(model, 100.0, 1000), launch_overhead_ms=overhead,
                                         stack=stack), quick=quick)
    s = dvasim.run(ch.config(section, pol, ch.workload(model, load_qps, n), launch_overhead_ms=overhead,
                             stack=stack)).summary
    return {"stack": s["stack"], "capacity_qps": cap, "capacity_at_bracket_top": not np.isfinite(top), "load_qps": load_qps,
            "mean_latency_ms": s["mean_latency_ms"], "p99_latency_ms": s["p99_latency_ms"],
            "throughput_at_load_qps": s["throughput_qps"], "stable_at_load": bool(s["steady_state"])}


def reference(model: str, quick: bool, stack: str | None = None) -> float:
    return ch.capacity_qps(ch.config(ch.model_cfg(model, ratio=0.5), ch.strategy_policy("VIII"),
                                     ch.workload(model, 100.0, 1000), stack=stack), quick=quick)[0]


def fig10(models, ratios, n, quick, clock, stack=None) -> pd.DataFrame:
    rows = []
    for model in models:
        ref = reference(model, quick, stack)
        for r in ratios:
            sec = ch.model_cfg(model, ratio=r)
            share = ch.stage_shares(profile(model, ratio=r), 1, ch.seq_len_of(model))[0]
            for label in ch.STRATEGIES:
                pt = throughput_point(model, sec, label, 0.9 * ref, n, quick, stack=stack)
                rows.append({"model": model, "stack": pt["stack"], "ratio": r, "stage0_share_bs1": share,
                             "strategy": label, "reference_qps": ref, **pt})
        print(f"figure 10: {model} done [{clock}]", flush=True)
    return pd.DataFrame(rows)


def fig12(models, stages, overheads, n, quick, clock, stack=None) -> pd.DataFrame:
    rows = []
    for model in models:
        ref = reference(model, quick, stack)
        for ov in overheads:
            for k in stages:
                sec = ch.model_cfg(model, stages=k)
                for label in ch.STRATEGIES:
                    pt = throughput_point(model, sec, label, 0.9 * ref, n, quick, overhead=ov, stack=stack)
                    rows.append({"model": model, "stack": pt["stack"], "stages": k, "launch_overhead_ms": ov,
                                 "strategy": label, "reference_qps": ref, **pt})
        print(f"figure 12: {model} done [{clock}]", flush=True)
    return pd.DataFrame(rows)


def fig13(models, ratios, batch_sizes, n_subs, stack=None) -> pd.DataFrame:
    rows = []
    for model in models:
        sl = ch.seq_len_of(model)
        for r in ratios:
            prof, sv = profile(model, ratio=r), served(model, ratio=r, stack=stack)
            cases = [(b, 2) for b in batch_sizes] + [(64, n) for n in n_subs if n != 2]
            for b, nsub in cases:
                rows.append({"figure": 13 if nsub == 2 else 14, "model": model, "stack": sv.label, "ratio": r,
                             "stage0_share_bs1": ch.stage_shares(prof, 1, sl)[0], "batch_size": b, "n_sub": nsub,
                             **ch.split_scenario(prof, b, nsub, sl, stack=sv)})
    return pd.DataFrame(rows)


def fig15(models, ratios, batch_sizes, grid_ratio, stack=None) -> pd.DataFrame:
    rows = []
    for model in models:
        sl = ch.seq_len_of(model)
        for r in ratios:
            prof, sv = profile(model, ratio=r), served(model, ratio=r, stack=stack)
            for b in batch_sizes:
                for base in ("naive", "pipelined"):
                    rows.append({"figure": 15, "model": model, "stack": sv.label, "ratio": r, "bs0": b, "bs1": b,
                                 "baseline": base, **ch.stretch_scenario(prof, b, b, sl, base, stack=sv)})
        prof, sv = profile(model, ratio=grid_ratio), served(model, ratio=grid_ratio, stack=stack)
        for b0 in batch_sizes:
            for b1 in batch_sizes:
                rows.append({"figure": 16, "model": model, "stack": sv.label, "ratio": grid_ratio, "bs0": b0,
                             "bs1": b1, "baseline": "naive", **ch.stretch_scenario(prof, b0, b1, sl, "naive", stack=sv)})
    return pd.DataFrame(rows)


def main(argv=None) -> dict[str, pd.DataFrame]:
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--figures", nargs="+", type=int, default=[10, 12, 13, 15], choices=[10, 12, 13, 15],
                   help="which figures (13 includes 14, 15 includes 16)")
    p.add_argument("--queries", type=int, default=None, help="queries of the fixed-load runs (default 3000)")
    p.add_argument("--fig16-ratio", type=float, default=0.1, help="slicing ratio of Figure 16's grid (default 0.1)")
    args = common.parse(p, argv)
    q = args.quick
    models = args.models or (["resnet152", "bert_base"] if q else list(ch.MODELS))
    sweep_models = args.models or (["resnet152"] if q else list(ch.MODELS))  # Figures 10 and 12 (capacity searches)
    n = args.queries or (300 if q else 3000)
    clock = common.Stopwatch()
    out = {}
    if 10 in args.figures:
        ratios = [0.25, 0.5] if q else ch.ratio_grid(0.1, 0.05, 0.95)
        df = out["fig10"] = fig10(sweep_models, ratios, n, q, clock, args.stack)
        common.save(df, args.out, "study_fig10_slice_position.csv")
        plot_lines(df, "ratio", "capacity_qps", args.out / "study_fig10_slice_position.png", FIG10_TITLE)
        show_wide(df, "ratio", "capacity_qps", "Figure 10: capacity (qps) by slicing ratio and strategy")
        show_wide(df, "ratio", "mean_latency_ms", "Figure 10: mean latency (ms) at 9/10 of VIII's capacity at r=0.5")
    if 12 in args.figures:
        ovs = overheads_for(args.stack)
        stages, ovs = ((1, 2), ovs[-1:]) if q else (STAGES, ovs)
        df = out["fig12"] = fig12(sweep_models, stages, ovs, n, q, clock, args.stack)
        common.save(df, args.out, "study_fig12_stages.csv")
        plot_lines(df, "stages", "capacity_qps", args.out / "study_fig12_stages.png", FIG12_TITLE,
                   style="launch_overhead_ms")
        for ov in ovs:
            d = df[df["launch_overhead_ms"] == ov]
            show_wide(d, "stages", "capacity_qps", f"Figure 12: capacity (qps), launch overhead {ov} ms/stage"
                                                   f"{stack_title(d)}")
            show_wide(d, "stages", "mean_latency_ms", f"Figure 12: mean latency (ms) at 9/10 of VIII's capacity at "
                                                      f"r=0.5, launch overhead {ov} ms/stage")
    if 13 in args.figures:
        ratios = [0.05, 0.5, 0.95] if q else ch.ratio_grid(0.05)
        df = out["fig13"] = fig13(models, ratios, SPLIT_BS if not q else (8, 64), SPLIT_N if not q else (2, 8),
                                  args.stack)
        common.save(df, args.out, "study_fig13_split.csv")
        plot_micro(df, args.out / "study_fig13_split.png", "split")
        f13 = df[df["figure"] == 13]
        show_wide(f13, "ratio", "speedup", "Figure 13: split speedup (naive / split mean latency), 2 x (BS=N)",
                  col="batch_size")
        show_wide(df[(df["batch_size"] == 64)], "ratio", "speedup", "Figure 14: split speedup, n x (BS=64)",
                  col="n_sub", ratios=[0.05, 0.5, 0.95])
        print(f"figures 13/14 done [{clock}]", flush=True)
    if 15 in args.figures:
        ratios = [0.05, 0.5, 0.95] if q else ch.ratio_grid(0.05)
        df = out["fig15"] = fig15(models, ratios, STRETCH_BS if not q else (1, 16), args.fig16_ratio, args.stack)
        common.save(df, args.out, "study_fig15_stretch.csv")
        plot_micro(df, args.out / "study_fig15_stretch.png", "stretch")
        f15 = df[(df["figure"] == 15) & (df["baseline"] == "naive")]
        show_wide(f15, "ratio", "speedup", "Figure 15: stretch speedup over naive batching, BS_0 = BS_1 = N",
                  col="bs0")
        f15p = df[(df["figure"] == 15) & (df["baseline"] == "pipelined")]
        show_wide(f15p, "ratio", "speedup", "Figure 15 (pipelined baseline): stretch speedup, BS_0 = BS_1 = N",
                  col="bs0", ratios=[0.05, 0.5, 0.95])
        f16 = df[df["figure"] == 16]
        for model, g in f16.groupby("model", sort=False):
            grid = g.pivot_table(index="bs0", columns="bs1", values="speedup")
            common.show(grid.reset_index(), f"Figure 16: stretch speedup, {model}, ratio {args.fig16_ratio} "
                                            "(rows BS_0, columns BS_1)", digits=3)
        print(f"figures 15/16 done [{clock}]", flush=True)
    print(f"total {clock}")
    return out


def show_wide(df, x, y, title, col="strategy", ratios=None) -> None:
    if ratios is not None:
        df = df[df[x].round(6).isin([round(r, 6) for r in ratios])]
    wide = df.pivot_table(index=[x], columns=["model", col], values=y, sort=False)
    wide.columns = [f"{ch.PAPER_NAMES.get(m, m)} {c}" for m, c in wide.columns]
    common.show(wide.reset_index(), title, digits=3)


QOS_MS = 200.0  # the capacities' p99 target
STRATEGY_WORDS = "dvabatch as strategies I (naive batching), II (pipelined only), VIII (stretch + split + pipeline)"


def plot_lines(df, x, y, path, title, style=None, device: str = ch.DEVICE) -> None:
    """Capacity (top) and mean latency at a fixed load (bottom) over ``x``, one line per strategy (their colours:
    ``STRATEGY_COLOURS``), one column per model. A fixed-load run that was not stable (``stable_at_load`` false)
    or over the 200 ms p99 carries its verdict's marker; a capacity whose search reached its bracket's top (a lower
    bound) is named above its panel. The title names the models, the ``device`` (the A100 tables), the stack, the
    policy and the load."""
    plt, sns = common.plt_sns()
    models = list(dict.fromkeys(df["model"]))
    fig, axes = plt.subplots(2, len(models), figsize=(5 * len(models), 8), squeeze=False)
    hue = [s for s in ch.STRATEGIES if s in set(df["strategy"])]
    v = common.with_verdicts(df, QOS_MS, stable="stable_at_load")
    v["line"] = v["strategy"].astype(str) + ("" if style is None else " " + v[style].astype(str))
    for j, model in enumerate(models):
        g = v[v["model"] == model]
        for i, (col, label) in enumerate(((y, "capacity (qps)"), ("mean_latency_ms", "mean latency (ms) at 9/10 ref"))):
            ax = axes[i, j]
            sns.lineplot(data=g, x=x, y=col, hue="strategy", hue_order=hue, palette=common.STRATEGY_COLOURS,
                         style=style, marker="o", ax=ax)
            ax.set(title=f"{ch.PAPER_NAMES[model]} ({model})" if i == 0 else "", ylabel=label)
            if x == "stages":
                ax.set_xscale("log", base=2)
            if i == 1:
                ax.set_yscale("log")
                common.marked_note(ax, common.mark_groups(ax, g, x, col, "line"))
            elif "capacity_at_bracket_top" in g:
                top = g[g["capacity_at_bracket_top"].map(lambda b: str(b).strip().lower() in ("true", "1"))]
                if len(top):
                    common.axis_note(ax, f"{len(top)} capacit{'ies' if len(top) > 1 else 'y'} at the search's "
                                         "top (a lower bound)")
    common.side_legend(fig, axes, y=0.8)
    common.readable(fig)
    rate = df["load_qps"] if "load_qps" in df else df.get("reference_qps")
    what = common.context(df, device, model=models, policy=STRATEGY_WORDS)
    load = (f"capacity: Poisson probes, p99 <= {QOS_MS:g} ms; latency: evenly spaced arrivals at 9/10 of VIII's "
            f"capacity at r = 0.5 ({common.rates_words(rate)})")
    save_figure(fig, path, f"{title} (marked: not stable, or p99 over {QOS_MS:g} ms)\n{what}\nload: {load}")


def plot_micro(df, path, op, device: str = ch.DEVICE) -> None:
    """Speedup of ``op`` (split: Figures 13-14; stretch: Figures 15-16) over the slicing ratio, one column per
    model; scripted scenarios (one batch, or two), so no run has a verdict to mark. The title names the models, the
    ``device`` (the A100 tables), the stack, the policy and the scenario (the load)."""
    plt, sns = common.plt_sns()
    models = list(dict.fromkeys(df["model"]))
    fig, axes = plt.subplots(2, len(models), figsize=(5 * len(models), 7.5), squeeze=False)
    for j, model in enumerate(models):
        g = df[df["model"] == model]
        if op == "split":
            a, b = g[g["figure"] == 13], g[g["batch_size"] == 64]
            sns.lineplot(data=a, x="ratio", y="speedup", hue="batch_size", palette="viridis", ax=axes[0, j])
            sns.lineplot(data=b, x="ratio", y="speedup", hue="n_sub", palette="magma", ax=axes[1, j])
            axes[0, j].set(title=f"{ch.PAPER_NAMES[model]} ({model}): 2 x (BS=N) (Fig. 13)")
            axes[1, j].set(title="n x (BS=64) (Fig. 14)")
        else:
            a = g[(g["figure"] == 15)]
            sns.lineplot(data=a, x="ratio", y="speedup", hue="bs0", style="baseline", palette="viridis",
                         ax=axes[0, j])
            axes[0, j].set(title=f"{ch.PAPER_NAMES[model]} ({model}): BS_0 = BS_1 = N (Fig. 15)")
            grid = g[g["figure"] == 16].pivot_table(index="bs0", columns="bs1", values="speedup")
            # centred on 1.0 by a range symmetric about it (seaborn's own center= goes through a colormap call
            # that matplotlib deprecates)
            half = float(np.nanmax(np.abs(grid.to_numpy(dtype=float) - 1.0))) or 1.0
            sns.heatmap(grid, annot=True, fmt=".2f", cmap="RdYlGn", vmin=1.0 - half, vmax=1.0 + half,
                        ax=axes[1, j], cbar=False, annot_kws={"fontsize": 7})
            axes[1, j].set(title=f"BS_0 x BS_1 at ratio {g[g['figure'] == 16]['ratio'].iloc[0]:g} (Fig. 16)")
        for ax in axes[:, j]:
            if ax.get_xlabel() == "ratio":
                ax.axhline(1.0, color="grey", lw=0.8, ls=":")
                ax.set_xlabel("slicing ratio Stage_0 / (Stage_0 + Stage_1)")
    names = ({0: "batch size N (2 sub-batches)", 1: "sub-batches n (N = 64)"} if op == "split"
             else {0: "N = BS_0 = BS_1; baseline"})
    for i, name in names.items():  # one legend per row, beside its last panel: never on the data
        for ax in axes[i, :-1]:
            if ax.get_legend() is not None:
                ax.get_legend().remove()
        if axes[i, -1].get_legend() is not None:
            axes[i, -1].legend(title=name, fontsize=7, title_fontsize=7, loc="upper left",
                               bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    titles = [ax.get_title() for ax in fig.axes]
    common.readable(fig)  # (which reads a title "a = b" as a facet's and keeps only "b": the titles are put back)
    for ax, title in zip(fig.axes, titles):
        ax.set_title(title)
    scenario = ("one batch of N queries arriving at once, split after Stage_0 into n sub-batches" if op == "split"
                else "BS_1 arriving as BS_0 starts Stage_0")
    what = common.context(df, device, model=models, policy=f"dvabatch with and without {op}")
    save_figure(fig, path, f"{op} speedup = mean latency without / with {op} (one scripted scenario)\n{what}\n"
                           f"load: {scenario}")

if __name__ == "__main__":
    main()
