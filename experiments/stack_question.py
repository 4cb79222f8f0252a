"""One question under each serving stack: BERT-base on an H100, 5,000 queries/s under a 50 ms p99 -- how many GPUs?

For every serving stack (``gpu-only``, the lower bound; ``cudagraph``, the one the h100 tables imply; ``torchscript``;
``pytorch-eager``) and for the engine fitted to the H100 replays (``experiments/h100_fit/engine_bert_base.toml``,
given as ``engine=``: its own host model, the stack ``custom``), and for ZeroBatch, DelayBatch and DVABatch at 2 and
4 stages (BERT-base, ``device = "h100"``, GLUE RTE lengths, max batch 64), one GPU's capacity under the SLO:

* ``capacity_qps``: :func:`dvasim.studies.capacity.capacity` (Poisson arrivals, p99 <= 50 ms, 2% resolution, each probe
  decided with 95% confidence);
* ``sustained_qps``: that search assumes that a rate passes whenever a higher one does; every config is also run
  on a ladder of rates below its capacity (``0.8^j`` of it, ``j`` = 12 .. 1; 2,000 queries each, pass = at most 1%
  slower than 50 ms), and where a rung fails the capacity is searched again between the rung below and the failing
  one. ``sustained_qps`` is the highest rate up to which every probed rate passes;
* ``gpus = ceil(5000 / sustained_qps)`` (independent GPUs, each given an equal Poisson share), checked by one run of
  4,000 queries at ``5000 / gpus`` queries/s on one GPU (``check_p99_ms``).

DelayBatch's window is tuned per stack and stage count among ``study.window_candidates("bert_base", "h100")``
(0.5 .. 16 x the batch-1 latency): the window of the highest capacity (ties: the smaller window).

Writes ``stack_question.csv`` (one row per stack, stage count and policy), ``stack_question_windows.csv`` (the
window tuning) and ``stack_question.png``.

Usage: ``python experiments/stack_question.py [--quick] [--out DIR] [--seed N]``.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import dvasim  # noqa: E402
from dvasim.studies import evaluation as study  # noqa: E402
from dvasim.studies.capacity import capacity, sustained_capacity  # noqa: E402

MODEL, DEVICE = "bert_base", "h100"
TARGET_QPS = 5000.0
SLO_MS = 50.0
STAGES = (2, 4)
ENGINE_FILE = Path(__file__).resolve().parent / "h100_fit" / "engine_bert_base.toml"
# label -> (stack name or None, engine file or None)
SERVERS = {
    "gpu-only": ("gpu-only", None),
    "cudagraph": ("cudagraph", None),
    "torchscript": ("torchscript", None),
    "pytorch-eager": ("pytorch-eager", None),
    "fitted engine": (None, ENGINE_FILE),
}
POLICIES = ("zerobatch", "delaybatch", "dvabatch")


def config(policy: dict, stages: int, seed: int) -> dict:
    return study.make_config(MODEL, policy, {"kind": "poisson", "rate_qps": 100.0, "n_queries": 1000, "seed": seed},
                             device=DEVICE, stages=stages, qos_ms=SLO_MS)


def one_gpu(policy: dict, stages: int, server: str, quick: bool, seed: int) -> dict:
    """One GPU's capacity and sustained capacity under the SLO (see the module docstring)."""
    stack, engine = SERVERS[server]
    cfg = config(policy, stages, seed)
    kw = dict(resolution=0.1, min_queries=300, max_queries=1200, min_duration_s=0.5) if quick else {}
    t0 = time.perf_counter()
    res = capacity(cfg, SLO_MS, percentile=99.0, stack=stack, engine=engine, **kw)
    top = res["capacity_qps"]
    sustained, first_fail = sustained_capacity(cfg, SLO_MS, top, steps=4 if quick else 12,
                                               n_queries=500 if quick else 2000, stack=stack, engine=engine, **kw)
    return {"stack": res["stack"], "capacity_qps": top, "sustained_qps": sustained, "first_fail_qps": first_fail,
            "top_exceeded": res["top_exceeded"], "probes": res["n_probes"], "wall_s": time.perf_counter() - t0}


def tune_delay(stages: int, server: str, quick: bool, seed: int) -> tuple[float, pd.DataFrame]:
    windows = study.window_candidates(MODEL, DEVICE)
    if quick:
        windows = windows[1:2]
    stack, engine = SERVERS[server]
    rows = []
    for w in windows:
        kw = dict(resolution=0.1, min_queries=300, max_queries=1200, min_duration_s=0.5) if quick else {}
        res = capacity(config({"name": "delaybatch", "max_queue_delay_ms": w}, stages, seed), SLO_MS,
                       percentile=99.0, stack=stack, engine=engine, **kw)
        rows.append({"server": server, "stack": res["stack"], "stages": stages, "window_ms": w,
                     "capacity_qps": res["capacity_qps"]})
    df = pd.DataFrame(rows)
    best = df.sort_values(["capacity_qps", "window_ms"], ascending=[False, True]).iloc[0]["window_ms"]
    df["best"] = df["window_ms"] == best
    return float(best), df


def check(policy: dict, stages: int, server: str, rate: float, seed: int, quick: bool) -> dict:
    stack, engine = SERVERS[server]
    cfg = config(policy, stages, seed)
    cfg = {**cfg, "workload": {**cfg["workload"], "rate_qps": rate, "n_queries": 1000 if quick else 4000,
                               "seed": seed + 101}}
    s = dvasim.run(cfg, progress=False, stack=stack, engine=engine).summary
    return {"check_rate_qps": rate, "check_p99_ms": s["p99_latency_ms"], "check_mean_ms": s["mean_latency_ms"],
            "check_mean_batch": s["mean_exit_batch_size"], "check_within_slo": s["p99_latency_ms"] <= SLO_MS}


def plot(df: pd.DataFrame, path: Path) -> None:
    plt, sns = common.plt_sns()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2), sharey=True)
    for ax, st in zip(axes, STAGES):
        d = df[df.stages == st]
        sns.barplot(data=d, x="server", y="gpus", hue="policy", ax=ax, order=list(SERVERS),
                    hue_order=list(POLICIES), palette=common.policy_colours(POLICIES), saturation=1)
        for cont in ax.containers:
            ax.bar_label(cont, fmt="%d", fontsize=7)
        ax.set_yscale("log")
        ax.set(xlabel="", ylabel=f"H100s for {TARGET_QPS:,.0f} qps, p99 <= {SLO_MS:g} ms",
               title=f"BERT-base, {st} stages")
        ax.tick_params(axis="x", labelrotation=15)
    fig.suptitle("One question under each serving stack (fitted engine: experiments/h100_fit)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict[str, pd.DataFrame]:
    p = common.parser(__doc__.splitlines()[0])
    args = common.parse(p, argv)
    if args.stack is not None:
        raise SystemExit("stack_question.py runs every stack; --stack does not apply")
    watch = common.Stopwatch()
    quick = args.quick
    servers = list(SERVERS)
    stages_list = (4,) if quick else STAGES
    policies = ("zerobatch", "dvabatch") if quick else POLICIES
    rows, tunings = [], []
    for server in servers:
        for stages in stages_list:
            for name in policies:
                pol = {"name": name}
                window = math.nan
                if name == "delaybatch":
                    window, tuned = tune_delay(stages, server, quick, args.seed)
                    tunings.append(tuned)
                    pol["max_queue_delay_ms"] = window
                r = one_gpu(pol, stages, server, quick, args.seed)
                gpus = math.ceil(TARGET_QPS / r["sustained_qps"]) if r["sustained_qps"] > 0 else math.inf
                row = {"server": server, "stages": stages, "policy": name, "window_ms": window, **r, "gpus": gpus}
                if math.isfinite(gpus):
                    row.update(check(pol, stages, server, TARGET_QPS / gpus, args.seed, quick))
                rows.append(row)
                print(f"{server:14s} {stages} stages {name:10s} capacity {r['capacity_qps']:8.1f} sustained "
                      f"{r['sustained_qps']:8.1f} qps -> {gpus} GPUs ({r['wall_s']:.1f} s)", flush=True)
    df = pd.DataFrame(rows)
    common.save(df, args.out, "stack_question.csv")
    if tunings:
        common.save(pd.concat(tunings, ignore_index=True), args.out, "stack_question_windows.csv")
    plot(df, args.out / "stack_question.png")
    piv = df.pivot_table(index=["stages", "policy"], columns="server", values="gpus", aggfunc="first")
    common.show(piv[[s for s in servers if s in piv.columns]].reset_index(),
                f"H100s needed for {TARGET_QPS:,.0f} qps of BERT-base under a {SLO_MS:g} ms p99")
    print(f"done in {watch}")
    return {"gpus": df}


if __name__ == "__main__":
    main()
