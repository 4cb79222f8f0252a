"""E2bird (Cui et al., TPDS'21) Figures 13 and 14 and Tables 1 and 4 in simulation: TF-Serving (NO_Wait, OPT_Wait,
Static) against N-Ebird and E-Ebird on the modelled Titan RTX, under a serving stack (``--stack``; default
``tfserving``, the paper's own: TF-Serving's batch thread, see ``dvasim stacks tfserving``).

* **Figure 14** (peak throughput under the QoS target): for every model and system, the highest Poisson rate whose
  p99 latency stays within 200 ms, found by :func:`dvasim.studies.capacity.capacity` (bracketing and bisection to 2%, each
  probe decided with 95% confidence). Written to ``e2bird_fig14_capacity.csv`` / ``.png``.
* **Figure 13** (latency under the diurnal load, §8.2): 400 queries, the first 150 at a low rate, the last 250 at a
  high rate (workload ``kind = "phases"``, Poisson within a phase). The paper calls the load high when TF-Serving's
  latencies come close to the 200 ms target; ours: the high rate is 0.9 x OPT_Wait's Figure 14 capacity of the model
  and the low rate 0.15 x (the paper gives neither number). Every query's latency goes to ``e2bird_fig13_queries.csv``;
  the mean and p99 per phase to ``e2bird_fig13_latency.csv`` (plot: ``e2bird_fig13.png``, latency against arrival
  order as in the paper's figure).
* **Table 1** (batch size, latency and throughput of TF-Serving, ResNet-152 only: the zoo has no ResNet-50/101):
  ``b`` closed-loop clients with no think time, so that TF-Serving's batch thread runs batches of exactly ``b`` one
  after another; latency = the mean query latency, throughput = the served rate. Written to ``e2bird_table1.csv``
  next to the paper's numbers.
* **Table 4** (E-Ebird's engine configuration per TotalBS): what E-Ebird's offline search chose, per model, next to
  the paper's Table 4 for Res152. Written to ``e2bird_table4.csv``.

The systems: TF-Serving runs its batches whole on one instance (its batch thread), max batch 32, timeouts 0
(NO_Wait) and 30 ms (OPT_Wait, Static: padded to 32; E2bird's 30 ms was tuned for ResNet-152, and the same value
is used for every model here). N-Ebird (workers [1, 1, 2, 4, 8, 16]) and E-Ebird (its engine from the offline
search) run with E2bird's memory pool (``[engine.transfer] mode = "pool"``: every input copied to the GPU on
arrival, one at a time, at 12 GB/s), so the stack's per-batch gathering and copy are skipped for them; they still
pay its per-batch request handling, launches, synchronisation and copy back, and under ``tfserving`` every worker's
batch thread holds its worker until its batch is answered (``idle_between_batches``). E-Ebird's offline search
charges every worker those same costs (its ``stack`` parameter). How TF-Serving's inputs reach the GPU depends on
the stack:

* on a serving stack (``tfserving`` and any other but ``gpu-only``): the stack's own path, the batch concatenated
  on the host and copied from pageable memory (``tfserving``: 5 GB/s and 6 GB/s; about 7 ms for a batch of 32
  images), with no ``[engine.transfer]``;
* under ``gpu-only`` (the GPU alone, as the results before serving stacks were run): as then, every batch's inputs
  copied when the batch is launched (``[engine.transfer] mode = "on_launch"``, 12 GB/s, 1.6 ms a batch of 32) and
  nothing else.

Inputs are 3x224x224 float32 images (602,112 bytes). Every model is one stage (a worker runs the whole model),
``sharing = "fluid"``.

Usage: ``python experiments/e2bird_figs13_14.py [--quick] [--out DIR] [--seed N] [--stack NAME]``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import dvasim  # noqa: E402
from dvasim.server.stacks import STACKS  # noqa: E402
from dvasim.studies.capacity import capacity  # noqa: E402

PAPER_STACK = "tfserving"  # E2bird's own stack (§3.2, §8.1)
QOS_MS = 200.0
MODELS = {  # label -> [model] section; E2bird's benchmarks that dvasim's zoo has, on the modelled Titan RTX
    "resnet152": {"name": "resnet152", "device": "titanrtx", "stages": 1},
    "vgg19": {"name": "vgg19", "device": "titanrtx", "stages": 1},
}
TRANSFER = {"input_bytes": 602112, "bandwidth_gbps": 12.0}
SYSTEMS = {  # label -> (policy, how the inputs reach the GPU: "batch" = TF-Serving's per-batch copy, "pool")
    "NO_Wait": ({"name": "tfserving-nowait"}, "batch"),
    "OPT_Wait": ({"name": "tfserving-optwait"}, "batch"),
    "Static": ({"name": "tfserving-static"}, "batch"),
    "N-Ebird": ({"name": "n-ebird"}, "pool"),
    "E-Ebird": ({"name": "e-ebird"}, "pool"),
}
LOW, HIGH = 0.15, 0.9  # the diurnal load's rates, as fractions of OPT_Wait's capacity (ours)
PAPER = {"n_over_tfs_throughput": 34.4, "e_over_n_throughput": 9.9, "max_latency_reduction": 82.4}
# E2bird Table 1, Res152 (TF-Serving, Titan RTX): batch size -> (latency ms, requests/s)
PAPER_TABLE1 = {4: (17.3, 231.0), 8: (29.2, 273.0), 16: (49.5, 323.0), 32: (93.7, 341.0)}
# E2bird Table 4 (Res152), verbatim: counts of workers of batch size 1, 2, 4, 8, 16, 32; the rows for TotalBS 4-16
# list five entries (the bs-32 count missing: read as 0)
PAPER_TABLE4 = {4: (0, 0, 1, 0, 0, 0), 8: (0, 0, 0, 1, 0, 0), 16: (0, 0, 2, 1, 0, 0), 32: (0, 0, 0, 2, 1, 0)}
PAPER_ENGINE = (1, 1, 1, 2, 1, 0)  # Table 4's "Inference Engine" row (one bs-4 worker: fewer than its TotalBS 16)


def config(model: str, system: str, workload: dict, stack: str = PAPER_STACK) -> dict:
    policy, path = SYSTEMS[system]
    policy = dict(policy)
    gpu_alone = STACKS[stack].adds_nothing
    engine: dict = {"sharing": "fluid"}
    if path == "pool":
        engine["transfer"] = {"mode": "pool", **TRANSFER}
        # (E-Ebird's offline search charges each worker the run's stack: the pipeline names it)
    elif gpu_alone:
        engine["transfer"] = {"mode": "on_launch", **TRANSFER}  # the copy of the results before serving stacks
    # else: the stack's own gathering and copy of the batch
    return {"model": dict(MODELS[model]), "policy": policy, "workload": workload, "qos": {"target_ms": QOS_MS},
            "engine": engine, "server": {"stack": stack}}


def fig14(models, quick: bool, seed: int, stack: str = PAPER_STACK) -> pd.DataFrame:
    rows = []
    for m in models:
        for system in SYSTEMS:
            t0 = time.perf_counter()
            kw = dict(resolution=0.1, min_queries=300, max_queries=1200, min_duration_s=0.5) if quick else {}
            res = capacity(config(m, system, {"kind": "poisson", "rate_qps": 1.0, "n_queries": 1000, "seed": seed},
                                  stack), QOS_MS, percentile=99.0, **kw)
            rows.append({"model": m, "stack": res.get("stack", stack), "system": system,
                         "capacity_qps": res["capacity_qps"], "capacity_searched_qps": res["capacity_searched_qps"],
                         "top_exceeded": res.get("top_exceeded"),
                         "probes": len(res.get("probes", [])), "wall_s": time.perf_counter() - t0})
    df = pd.DataFrame(rows)
    tfs = df[df.system == "OPT_Wait"].set_index("model")["capacity_qps"]
    nb = df[df.system == "N-Ebird"].set_index("model")["capacity_qps"]
    df["vs_opt_wait_pct"] = [100.0 * (c / tfs[m] - 1.0) for m, c in zip(df.model, df.capacity_qps)]
    df["vs_n_ebird_pct"] = [100.0 * (c / nb[m] - 1.0) for m, c in zip(df.model, df.capacity_qps)]
    return df


def fig13(models, caps: pd.DataFrame, quick: bool, seed: int,
          stack: str = PAPER_STACK) -> tuple[pd.DataFrame, pd.DataFrame]:
    n_low, n_high = (40, 60) if quick else (150, 250)
    per_query, rows = [], []
    for m in models:
        c = float(caps[(caps.model == m) & (caps.system == "OPT_Wait")]["capacity_qps"].iloc[0])
        wl = {"kind": "phases", "seed": seed,
              "phases": [{"n": n_low, "rate_qps": LOW * c}, {"n": n_high, "rate_qps": HIGH * c}]}
        for system in SYSTEMS:
            r = dvasim.run(config(m, system, wl, stack))
            q = r.queries.sort_values("query_id")
            lat = (q["finish_ms"] - q["arrival_ms"]).to_numpy()
            per_query.append(pd.DataFrame({"model": m, "stack": r.summary["stack"], "system": system,
                                           "query": q["query_id"].to_numpy(),
                                           "phase": ["low"] * n_low + ["high"] * n_high, "latency_ms": lat}))
            for phase, sl in (("low", slice(0, n_low)), ("high", slice(n_low, None))):
                x = pd.Series(lat[sl])
                rows.append({"model": m, "stack": r.summary["stack"], "system": system, "phase": phase,
                             "rate_qps": (LOW if phase == "low" else HIGH) * c, "mean_ms": x.mean(),
                             "p99_ms": x.quantile(0.99), "qos_violations": int((x > QOS_MS).sum())})
    lat = pd.DataFrame(rows)
    base = lat[lat.system == "OPT_Wait"].set_index(["model", "phase"])["mean_ms"]
    nb = lat[lat.system == "N-Ebird"].set_index(["model", "phase"])["mean_ms"]
    lat["reduction_vs_opt_wait_pct"] = [100.0 * (1 - v / base[(m, p)]) for m, p, v in
                                        zip(lat.model, lat.phase, lat.mean_ms)]
    lat["reduction_vs_n_ebird_pct"] = [100.0 * (1 - v / nb[(m, p)]) for m, p, v in
                                       zip(lat.model, lat.phase, lat.mean_ms)]
    return lat, pd.concat(per_query, ignore_index=True)


def table1(quick: bool, stack: str = PAPER_STACK) -> pd.DataFrame:
    """E2bird's Table 1 for ResNet-152: TF-Serving's batch thread running batches of exactly ``b`` back to back
    (``b`` closed-loop clients, no think time; NO_Wait takes all ``b`` as one batch)."""
    rows = []
    for b, (lat_p, thr_p) in PAPER_TABLE1.items():
        wl = {"kind": "closed", "clients": b, "n_queries": b * (5 if quick else 20), "seed": 0}
        r = dvasim.run(config("resnet152", "NO_Wait", wl, stack))
        q = r.queries
        s = r.summary
        rows.append({"model": "resnet152", "stack": s["stack"], "batch_size": b,
                     "mean_exit_batch_size": s["mean_exit_batch_size"], "latency_ms": q["latency_ms"].mean(),
                     "throughput_qps": s["throughput_qps"], "paper_latency_ms": lat_p, "paper_throughput_qps": thr_p})
    df = pd.DataFrame(rows)
    df["latency_vs_paper_pct"] = 100.0 * (df.latency_ms / df.paper_latency_ms - 1.0)
    df["throughput_vs_paper_pct"] = 100.0 * (df.throughput_qps / df.paper_throughput_qps - 1.0)
    return df


def table4(models, stack: str = PAPER_STACK) -> pd.DataFrame:
    """E-Ebird's offline search: the configuration per TotalBS and the engine, as the policy resolved them."""
    rows = []
    for m in models:
        r = dvasim.run(config(m, "E-Ebird", {"kind": "poisson", "rate_qps": 10.0, "n_queries": 20, "seed": 0},
                              stack))
        pol = r.config["policy"]
        engine = [sum(1 for w in pol["engine_workers"] if w == s) for s in (1, 2, 4, 8, 16, 32)]
        confs = {int(t): tuple(c) for t, c in pol["engine_confs"].items()}
        for t, c in [*confs.items(), ("engine", tuple(engine))]:
            paper = (PAPER_ENGINE if t == "engine" else PAPER_TABLE4.get(t)) if m == "resnet152" else None
            rows.append({"model": m, "stack": r.summary["stack"], "total_bs": t, "configuration": list(c),
                         "workers": sum(c), "paper_configuration": None if paper is None else list(paper),
                         "same_as_paper": None if paper is None else tuple(c) == tuple(paper),
                         "max_inf": pol.get("max_inf"),
                         "search_stack": (pol.get("search_costs") or {}).get("stack", "gpu-only")})
    return pd.DataFrame(rows)


def system_colours() -> dict[str, str]:
    """Each system's colour: its policy's in every figure (``common.PALETTE``)."""
    return {label: common.PALETTE[policy["name"]] for label, (policy, _) in SYSTEMS.items()}


def plot13(per_query: pd.DataFrame, path: Path, stack: str) -> None:
    plt, sns = common.plt_sns()
    models = list(dict.fromkeys(per_query.model))
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.2), squeeze=False)
    for ax, m in zip(axes[0], models):
        d = per_query[per_query.model == m]
        sns.lineplot(data=d, x="query", y="latency_ms", hue="system", ax=ax, linewidth=0.8,
                     palette=system_colours())
        common.slo_line(ax, QOS_MS)
        n_low = int((d[d.system == d.system.iloc[0]].phase == "low").sum())
        ax.axvspan(n_low, d["query"].max(), color="grey", alpha=0.1)
        ax.set(title=f"{m}: low then high load (shaded)", xlabel="arrival order", ylabel="latency (ms)")
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, title="system", loc="upper left", bbox_to_anchor=(1.0, 0.9), fontsize=8)
    fig.suptitle(f"E2bird Figure 13: per-query latency under the diurnal load\n"
                 f"{common.context(None, 'titanrtx', stack=stack, policy=list(system_colours()))}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def plot14(df: pd.DataFrame, path: Path, stack: str) -> None:
    """Each system's capacity per model; a system whose search held no rate (capacity 0: not one probe met the
    SLO) has no bar, and the figure says so where its bar would be and in a note."""
    plt, sns = common.plt_sns()
    fig, ax = plt.subplots(figsize=(8.2, 4.2))
    order = list(dict.fromkeys(df["model"]))
    hues = list(dict.fromkeys(df["system"]))
    sns.barplot(data=df, x="model", y="capacity_qps", hue="system", order=order, hue_order=hues,
                palette=system_colours(), saturation=1, ax=ax)
    width = 0.8 / len(hues)
    none = df[~(df["capacity_qps"] > 0)]
    for r in none.itertuples():
        x = order.index(r.model) - 0.4 + width * (hues.index(r.system) + 0.5)
        ax.text(x, 0, f"{r.system}:\nno rate\nmet the SLO", rotation=90, ha="center", va="bottom", fontsize=7,
                color="0.2")
    ax.set(ylabel=f"peak throughput, p99 <= {QOS_MS:g} ms (qps)", xlabel="",
           title=f"E2bird Figure 14: capacity per system\n{common.context(df, 'titanrtx', stack=stack)}")
    # (the marker's meaning is written beside it: the legend keeps the systems alone)
    common.mark_verdicts(ax, [order.index(r.model) - 0.4 + width * (hues.index(r.system) + 0.5)
                              for r in none.itertuples()], [0.0] * len(none), ["over-SLO"] * len(none),
                         legend=False)
    if len(none):
        common.axis_note(ax, "no bar: " + ", ".join(f"{r.model} {r.system}" for r in none.itertuples())
                         + " (capacity 0: even its lowest probe was over the SLO)")
    ax.legend(title="system", loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main(argv=None) -> dict[str, pd.DataFrame]:
    p = common.parser(__doc__.splitlines()[0])
    p.set_defaults(stack=PAPER_STACK)
    args = common.parse(p, argv)
    stack = args.stack
    watch = common.Stopwatch()
    models = args.models or (["resnet152"] if args.quick else list(MODELS))
    print(f"stack: {stack}")
    caps = fig14(models, args.quick, args.seed, stack)
    common.save(caps, args.out, "e2bird_fig14_capacity.csv")
    plot14(caps, args.out / "e2bird_fig14_capacity.png", stack)
    common.show(caps, f"E2bird Figure 14: peak throughput (qps) under p99 <= {QOS_MS:g} ms, stack {stack}")
    lat, per_query = fig13(models, caps, args.quick, args.seed, stack)
    common.save(lat, args.out, "e2bird_fig13_latency.csv")
    common.save(per_query, args.out, "e2bird_fig13_queries.csv")
    plot13(per_query, args.out / "e2bird_fig13.png", stack)
    common.show(lat, f"E2bird Figure 13: latency by phase of the diurnal load (mean, p99 in ms), stack {stack}")
    t1 = table1(args.quick, stack)
    common.save(t1, args.out, "e2bird_table1.csv")
    common.show(t1, f"E2bird Table 1 (ResNet-152, TF-Serving batches of b back to back), stack {stack}")
    t4 = table4(models, stack)
    common.save(t4, args.out, "e2bird_table4.csv")
    common.show(t4, f"E2bird Table 4: E-Ebird's configurations per TotalBS, stack {stack}")
    n = caps.set_index(["model", "system"])["capacity_qps"]
    for m in models:
        print(f"{m} ({stack}): N-Ebird vs OPT_Wait {100 * (n[(m, 'N-Ebird')] / n[(m, 'OPT_Wait')] - 1):+.1f}% "
              f"(paper avg +{PAPER['n_over_tfs_throughput']}%), E-Ebird vs N-Ebird "
              f"{100 * (n[(m, 'E-Ebird')] / n[(m, 'N-Ebird')] - 1):+.1f}% (paper avg +{PAPER['e_over_n_throughput']}%)")
    print(f"done in {watch}")
    return {"fig14": caps, "fig13": lat, "fig13_queries": per_query, "table1": t1, "table4": t4}


if __name__ == "__main__":
    main()
