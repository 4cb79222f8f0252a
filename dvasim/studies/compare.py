"""``dvasim compare``: the paper's Figures 14 and 16 in simulation (six models x three loads x ZeroBatch /
DelayBatch / DVABatch on the Titan RTX tables), with DVABatch's latency reduction against each baseline, where
that reduction comes from (DVABatch's cumulative ablations) and how Triton with two model instances compares.

Every run names its serving stack (:mod:`dvasim.server`): ``--stack NAME`` runs them all on that stack, ``--engine
ENGINE.toml`` with an engine file from ``dvasim fit``; by default each model runs on the stack its table implies
(the Titan RTX tables: ``triton-tensorrt-21.10``, Triton 21.10's rules). The tables, ``compare.csv`` and ``calibration.csv`` have a ``stack``
column, and the figures' titles name the stacks.

With ``--seeds K`` every (model, load, policy) run is repeated over K seeds: ``compare.csv`` holds the mean over
the seeds of every number, the mean and p99 latency with their Student-t interval (``mean_latency_ms_lo`` /
``_hi``, ``p99_latency_ms_lo`` / ``_hi``) and ``n_seeds``; ``reductions.csv`` each reduction's interval
(``vs_zerobatch_%_lo_mean`` ...) and whether it is a tie (``vs_zerobatch_tie_mean`` ...: the difference within the
two intervals, :func:`dvasim.reporting.intervals.tie`), and the printed tables say ``tie`` there. A bootstrap over
one run's queries would not be sound here (successive latencies in a queue are correlated): the intervals come
from seeds only, and one seed (the default) prints and writes exactly what it always did.

This module holds the study's stacks and printed report; its command line (the arguments, the files written) is
:mod:`dvasim.cli.compare`."""

from __future__ import annotations

import pandas as pd

from dvasim.studies import evaluation as study

PAPER = {  # the paper's average reductions (§8.2), for the printout
    "mean_latency_ms": {"zerobatch": (16.1, 39.0, 57.7), "delaybatch": (35.4, 47.3, 48.5)},
    "p99_latency_ms": {"zerobatch": (16.9, 27.4, 53.7), "delaybatch": (45.2, 45.1, 29.2)},
}


def stack_of(model: str, device: str, stack: str | None = None, engine=None) -> str:
    """The stack a compare run of ``model`` serves on (as :func:`dvasim.api.run` resolves it): ``stack``, else
    ``custom`` for an engine file with a host, else the one the model's table implies."""
    from dvasim import config as cfgmod
    from dvasim.model.catalog import resolve_model
    from dvasim.server.resolve import resolve_stack

    raw = study.make_config(model, {"name": "zerobatch"}, {"kind": "poisson", "rate_qps": 1.0, "n_queries": 1},
                            device=device)
    cfg = cfgmod.resolve(raw, engine=engine)
    return resolve_stack(cfg, resolve_model(cfg["model"]), stack=stack).label


def stack_lines(models, device: str, stack: str | None = None, engine_file=None,
                default_device: str = "titanrtx") -> list[str]:
    """What ``dvasim compare`` prints about its stack before the first run: ``stack: NAME (WHY)`` (one line per
    stack when the models' differ), and, where ``device`` is not ``default_device`` and no stack is named, that the
    stack follows the device (so a comparison across devices is one across stacks too, unless ``--stack`` holds
    it)."""
    from dvasim.studies.sweep import config_stack

    seen: dict[tuple[str, str], list[str]] = {}
    for m in models:
        raw = study.make_config(m, {"name": "zerobatch"}, {"kind": "poisson", "rate_qps": 1.0, "n_queries": 1},
                                device=device, stack=stack)
        seen.setdefault(config_stack(raw, stack=stack, engine=engine_file), []).append(m)
    from dvasim.server.resolve import stack_line

    lines = [stack_line(name, why) + (f" for {', '.join(ms)}" if len(seen) > 1 else "")
             for (name, why), ms in seen.items()]
    if stack is None and device != default_device and all(why.startswith("implied by device") for _, why in seen):
        other, _ = config_stack(study.make_config(models[0], {"name": "zerobatch"},
                                                  {"kind": "poisson", "rate_qps": 1.0, "n_queries": 1},
                                                  device=default_device), engine=engine_file)
        if other not in {name for name, _ in seen}:
            lines.append(f"note: the stack follows --device: {device} implies {', '.join(n for n, _ in seen)}, "
                         f"{default_device} (the default) {other}; a comparison of two devices compares two stacks "
                         "too unless --stack NAME holds it")
    return lines


def with_stacks(results: pd.DataFrame, calib: pd.DataFrame, device: str, stack: str | None = None,
                engine_file=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``results`` and ``calib`` with a ``stack`` column after ``model``: each run's ``summary["stack"]`` where
    the rows carry it, else the stack each model resolves to (:func:`stack_of`)."""
    if "stack" not in results.columns or results["stack"].isna().any():
        named = {m: stack_of(m, device, stack, engine_file) for m in dict.fromkeys(results["model"])}
        filled = results["model"].map(named)
        results = results.assign(stack=results["stack"].fillna(filled) if "stack" in results.columns else filled)
    per_model = results.groupby("model", sort=False)["stack"].agg(lambda x: "/".join(dict.fromkeys(x)))
    calib = calib.assign(stack=calib["model"].map(per_model))
    return _after_model(results), _after_model(calib)


def _after_model(df: pd.DataFrame) -> pd.DataFrame:
    cols = [c for c in df.columns if c != "stack"]
    at = cols.index("model") + 1 if "model" in cols else 0
    return df[cols[:at] + ["stack"] + cols[at:]]


def stack_title(results: pd.DataFrame) -> str:
    """A figure title's stack part: `` [stack: NAME]`` (the stacks of the runs, when they differ)."""
    names = list(dict.fromkeys(results["stack"])) if "stack" in results else []
    return f" [stack: {', '.join(map(str, names))}]" if names else ""


def compare_figures(results: pd.DataFrame, att: pd.DataFrame | None, out, device: str,
                    slo_ms: float = study.QOS_MS) -> list[tuple[str, tuple, dict]]:
    """``dvasim compare``'s figures, each ``(name of a dvasim.reporting.plots function, args, kwargs)`` writing one
    file under ``out``: Figure 16 (p99, the SLO drawn), Figure 14 (mean) and, where the attribution has shares,
    its bars (the device, the offered rates). The command draws them (two processes); a redraw from the
    committed CSVs (``experiments/redraw_figures.py``) draws the same list."""
    from pathlib import Path

    out, on = Path(out), stack_title(results)
    figures = [("policy_bars", (results, "p99_latency_ms", out / "fig16_p99_latency.png",
                                f"p99 latency (paper Figure 16){on}"), {"device": device, "slo_ms": slo_ms}),
               ("policy_bars", (results, "mean_latency_ms", out / "fig14_mean_latency.png",
                                f"mean latency (paper Figure 14){on}"), {"device": device})]
    if att is not None and att["share_multientry_pp"].notna().any():
        figures.append(("attribution_bars", (att, out / "attribution.png", "DVABatch's mean-latency reduction vs "
                                             f"DelayBatch, by step (points of DelayBatch's mean){on}"),
                        {"device": device, "offered": results}))
    return figures


def print_report(results: pd.DataFrame, calib: pd.DataFrame, red: pd.DataFrame, file,
                 slo_ms: float = study.QOS_MS) -> None:
    pd.set_option("display.width", 160)
    print(f"\nDelayBatch window (tuned for peak throughput) and peak throughput (p99 <= {slo_ms:g} ms):", file=file)
    print(calib.round(1).to_string(index=False), file=file)
    for metric, label in (("mean_latency_ms", "mean"), ("p99_latency_ms", "p99")):
        piv = results.pivot_table(index=["model", "load"], columns="policy", values=metric)
        piv = piv[[p for p in study.POLICIES if p in piv.columns]]
        r = _reduction_cells(red.set_index(["model", "load"]), label)
        table = piv.join(r).reindex(sorted(piv.index, key=lambda k: (k[0], list(study.LOADS).index(k[1]))))
        table = _stack_column(table, results)
        seeds = f" over {int(results['n_seeds'].iloc[0])} seeds" if "n_seeds" in results.columns else ""
        how = (" (mean over the seeds; the reduction with its 95% interval, tie: within the intervals)" if seeds
               else "")
        print(f"\n{label} latency (ms) and DVABatch's reduction (%){seeds}{how}:", file=file)
        print(table.round(2).to_string(), file=file)
        avg = red.groupby("load")[[f"vs_zerobatch_%_{label}", f"vs_delaybatch_%_{label}"]].mean()
        avg = avg.reindex([x for x in study.LOADS if x in avg.index])
        print(f"\naverage {label} reduction over models (ours | paper):", file=file)
        for i, (load, row) in enumerate(avg.iterrows()):
            pz, pdl = PAPER[metric]["zerobatch"][i], PAPER[metric]["delaybatch"][i]
            print(f"  {load:>6}: vs ZeroBatch {row.iloc[0]:6.1f}% | {pz:4.1f}%   "
                  f"vs DelayBatch {row.iloc[1]:6.1f}% | {pdl:4.1f}%", file=file)


def print_built(red: pd.DataFrame, calib: pd.DataFrame, file) -> None:
    """DVABatch as its authors built it (``dvabatch-built``): its average reductions over the models against each
    baseline, beside the paper's, and its peak against DelayBatch's."""
    print("\nDVABatch as built (dvabatch-built: the authors' backend, Triton's batcher in front), average reduction "
          "over models (ours | paper):", file=file)
    for metric, label in (("mean_latency_ms", "mean"), ("p99_latency_ms", "p99")):
        avg = red.groupby("load")[[f"vs_zerobatch_%_{label}", f"vs_delaybatch_%_{label}"]].mean()
        avg = avg.reindex([x for x in study.LOADS if x in avg.index])
        for i, (load, row) in enumerate(avg.iterrows()):
            pz, pdl = PAPER[metric]["zerobatch"][i], PAPER[metric]["delaybatch"][i]
            print(f"  {label:>4} {load:>6}: vs ZeroBatch {row.iloc[0]:6.1f}% | {pz:4.1f}%   "
                  f"vs DelayBatch {row.iloc[1]:6.1f}% | {pdl:4.1f}%", file=file)
    if "peak_qps_dvabatch-built" in calib.columns:
        cols = ["model", "peak_qps_delaybatch", "peak_qps_dvabatch", "peak_qps_dvabatch-built"]
        print("\npeak throughput (qps) of DelayBatch and of DVABatch as described and as built:", file=file)
        print(calib[[c for c in cols if c in calib.columns]].round(1).to_string(index=False), file=file)


def _reduction_cells(red: pd.DataFrame, label: str) -> pd.DataFrame:
    """DVABatch's reductions (``label``: mean or p99) per (model, load): the numbers; over several seeds each is
    ``38.2 [35.1, 41.3]`` (its interval) or ``tie (1.2)`` where the difference is within the intervals
    (:func:`dvasim.reporting.intervals.tie`)."""
    cols = [f"vs_zerobatch_%_{label}", f"vs_delaybatch_%_{label}"]
    if f"vs_zerobatch_tie_{label}" not in red.columns:
        return red[cols]
    out = pd.DataFrame(index=red.index)
    for base, col in zip(("zerobatch", "delaybatch"), cols):
        cells = []
        for point, lo, hi, tied in zip(red[col], red[f"vs_{base}_%_lo_{label}"], red[f"vs_{base}_%_hi_{label}"],
                                       red[f"vs_{base}_tie_{label}"]):
            if pd.isna(point):
                cells.append("")
            elif not pd.isna(tied) and bool(tied):
                cells.append(f"tie ({point:.1f})")
            else:
                cells.append(f"{point:.1f} [{lo:.1f}, {hi:.1f}]")
        out[col] = cells
    return out


def _stack_column(table: pd.DataFrame, results: pd.DataFrame) -> pd.DataFrame:
    """A (model, load)-indexed table with the rows' stack as its first column."""
    if "stack" not in results:
        return table
    by = results.groupby(["model", "load"])["stack"].agg(lambda x: "/".join(dict.fromkeys(map(str, x))))
    table = table.copy()
    table.insert(0, "stack", [by.get(k, "") for k in table.index])
    return table


SHARE_NAMES = study.SHARE_NAMES
X2_NAMES = {"zerobatch-x2": "ZeroBatch", "delaybatch-x2": "DelayBatch"}


def print_variants(results: pd.DataFrame, file) -> None:
    """Mean latency of every variant run, per model and load."""
    piv = results.pivot_table(index=["model", "load"], columns="policy", values="mean_latency_ms")
    order = [v for v in study.VARIANT_BY_LABEL if v in piv.columns]
    piv = piv[order + [c for c in piv.columns if c not in order]]
    piv = _stack_column(piv.reindex(sorted(piv.index, key=lambda k: (k[0], list(study.LOADS).index(k[1])))), results)
    print("\nmean latency (ms) of every variant (x2: two model instances; dva-*: DVABatch's cumulative ablations):",
          file=file)
    print(piv.round(2).to_string(), file=file)


def print_attribution(att: pd.DataFrame, file) -> None:
    """The shares of DVABatch's mean-latency reduction against DelayBatch per model (per load and averaged over
    the loads), and a sentence per model on Triton with two model instances."""
    if att.empty:
        return
    loads = [x for x in study.LOADS if x in set(att["load"])]
    if att[list(SHARE_NAMES)].notna().any().any():
        _print_shares(att, loads, file)
    x2_cols = ["vs_zerobatch-x2_%", "vs_delaybatch-x2_%"]
    if not att[x2_cols].notna().any().any():
        return
    tol = 100 * study.MATCH_TOLERANCE
    print(f"\nTriton with two model instances (instance_group count 2) against DVABatch's mean latency "
          f"(matches = within {tol:g}% of it or below):", file=file)
    for model, g in att.groupby("model", sort=False):
        g = g.set_index("load").reindex(loads)
        said = False
        run = [x2 for x2 in X2_NAMES if g[f"vs_{x2}_%"].notna().any()]
        for x2 in run:
            hit = [ld for ld in loads if bool(g.loc[ld, f"{x2}_matches"])]
            if hit:
                gaps = ", ".join(f"{ld} {100 * (g.loc[ld, f'{x2}_mean_latency_ms'] / g.loc[ld, 'dvabatch_mean_latency_ms'] - 1):+.1f}%"
                                 for ld in hit)
                print(f"  {model}: {X2_NAMES[x2]} with two instances matches or beats DVABatch at {_and(hit)} load "
                      f"(its mean vs DVABatch's: {gaps}).", file=file)
                said = True
        if run and not said:
            best = g[[f"vs_{x2}_%" for x2 in run]].min(axis=1)
            names = _and([X2_NAMES[x2] for x2 in run])
            print(f"  {model}: DVABatch beats {names} with two instances at every load (by at least "
                  f"{best.min():.1f}% of the baseline's mean).", file=file)


def _print_shares(att: pd.DataFrame, loads: list[str], file) -> None:
    print("\nWhere DVABatch's reduction comes from: its mean-latency reduction vs DelayBatch (%) split into steps, "
          "in points of\nDelayBatch's mean (multi-entry = delaybatch -> dva-multientry, stretch -> dva+stretch, "
          "split -> dva+split,\ninput clust. -> dva+input (token models), rest = last ablation -> dvabatch: its "
          "policy selection and Policy I's window):", file=file)
    cols = ["reduction_%", *SHARE_NAMES]
    for model, g in att.groupby("model", sort=False):
        t = g.set_index("load").reindex(loads)[cols]
        t.loc["mean of loads"] = t.mean(axis=0)
        t = t.rename(columns={"reduction_%": "total %", **SHARE_NAMES})
        if t["input clust."].isna().all():
            t = t.drop(columns="input clust.")
        print(f"\n  {model}", file=file)
        print("\n".join("    " + line for line in t.round(1).to_string().splitlines()), file=file)


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
