"""One question under each serving stack: BERT-base on an H100, 5,000 queries/s under a 50 ms p99 -- how many GPUs?

For every serving stack (``gpu-only``, the lower bound; ``cudagraph``, the one the h100 tables imply; ``torchscript``;
``pytorch-eager``) and for the engine fitted to the H100 replays (``experiments/h100_fit/engine_bert_base.toml``,
given as ``engine=``: its own host model, the stack ``custom``), and for ZeroBatch, DelayBatch and DVABatch at 2 and
4 stages (BERT-base, ``device = "h100"``, GLUE RTE lengths, max batch 64), one GPU's capacity under the SLO:

* ``capacity_qps``: :func:`dvasim.studies.capacity.capacity` under its default probe rules (issue 34: Poisson
  arrivals, p99 <= 50 ms, 2% resolution, each probe at least 60 s of arrivals and decided by LoadGen's early-stopping
  bound at 0.99, every accepted rate also run from a backlog of one SLO of arrivals: a rate it does not recover
  from is ``metastable`` and refused). The question is a GPU count for 5,000 qps, so the search's top is
  ``TOP_FACTOR`` x 5,000 = 6,250 qps and is not doubled: a GPU that holds 6,250 qps is counted as holding
  "at least 6,250" (``top_exceeded`` False), enough for one GPU;
* ``sustained_qps``: that search assumes that a rate passes whenever a higher one does; every config is also run
  on a ladder of rates below its capacity (``0.8^j`` of it, ``j`` = 12 .. 1; 2,000 queries each, pass = at most 1%
  slower than 50 ms), and where a rung fails the capacity is searched again between the rung below and the failing
  one. ``sustained_qps`` is the highest rate up to which every probed rate passes;
* ``gpus_searched = ceil(5000 / sustained_qps)`` (independent GPUs, each given an equal Poisson share; these
  searches run without ``capacity``'s own long-run confirmation, ``confirm_factor = 0``: the count they start is
  confirmed by long runs below);
* ``gpus``: the smallest count whose share holds in long runs, from ``gpus_searched`` (as ``dvasim plan`` confirms:
  up while a count fails, then down while the one below holds; :func:`gpu_count`). A count holds when one GPU at
  ``5000 / count`` queries/s (another seed) is ``stable`` for one probe's length (60 s of arrivals), from empty and
  from a backlog of one SLO of arrivals (``[qos] trigger = "backlog"``), and then for ``CONFIRM_FACTOR`` = 10 x that
  (600 s of arrivals). ``at_*`` is the answer's long run, ``below_*`` one GPU fewer (it fails), ``tried`` every
  count's verdicts.

DelayBatch's window is chosen per stack and stage count among ``study.window_candidates("bert_base", "h100")``
(0.5 .. 16 x the batch-1 latency) by searches with short probes (``TUNE_PROBE_S`` = 5 s of arrivals, no trigger
test): the window of the highest capacity (ties: the smaller window). That is a choice among candidates, not an
answer; the capacity at the chosen window is then searched under the full rules above.

The configs run on ``--workers`` processes (default one per core; the result does not depend on them). Writes
``stack_question.csv`` (one row per stack, stage count and policy), ``stack_question_windows.csv`` (the window
tuning) and ``stack_question.png``.

Usage: ``python experiments/stack_question.py [--quick] [--out DIR] [--seed N] [--workers N] [--searched CSV]``
(``--searched``: reuse an earlier run's searches, run only the GPU counts' checks). Run it on the compiled core
(which ``pip install``, so ``make run``, builds; ``dvasim --version`` says which core runs): the full run takes over
an hour on 2 cores.
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
from dvasim.studies.capacity import MIN_DURATION_S, capacity, sustained_capacity  # noqa: E402

MODEL, DEVICE = "bert_base", "h100"
TARGET_QPS = 5000.0
SLO_MS = 50.0
STAGES = (2, 4)
TOP_FACTOR = 1.25  # the search's top: a GPU holding 1.25 x the target is one GPU whatever its capacity beyond
CONFIRM_FACTOR = 10  # a count's long run: 10 x a probe (600 s of arrivals), as dvasim plan confirms (issue 34)
TUNE_PROBE_S = 5.0  # DelayBatch's window is chosen with probes this long (then searched under the full rules)
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
QUICK = dict(resolution=0.1, min_queries=300, max_queries=1200, min_duration_s=0.5)


def config(policy: dict, stages: int, seed: int) -> dict:
    return study.make_config(MODEL, policy, {"kind": "poisson", "rate_qps": 100.0, "n_queries": 1000, "seed": seed},
                             device=DEVICE, stages=stages, qos_ms=SLO_MS)


def one_gpu(policy: dict, stages: int, server: str, quick: bool, seed: int) -> dict:
    """One GPU's capacity and sustained capacity under the SLO (see the module docstring)."""
    stack, engine = SERVERS[server]
    cfg = config(policy, stages, seed)
    # the searches only start the GPU count, which gpu_count confirms with its own long runs: no confirmation here
    kw = {**(QUICK if quick else {}), "confirm_factor": 0}
    t0 = time.perf_counter()
    res = capacity(cfg, SLO_MS, percentile=99.0, stack=stack, engine=engine, hi=TOP_FACTOR * TARGET_QPS,
                   max_doublings=0, workers=1, **kw)
    top = res["capacity_qps"]
    sustained, first_fail = sustained_capacity(cfg, SLO_MS, top, steps=4 if quick else 12,
                                               n_queries=500 if quick else 2000, stack=stack, engine=engine,
                                               workers=1, **kw)
    deciders = sorted({p["decided_by"].split(" (")[0] for p in res["probes"]})
    return {"stack": res["stack"], "capacity_qps": top, "sustained_qps": sustained, "first_fail_qps": first_fail,
            "top_exceeded": res["top_exceeded"], "probes": res["n_probes"], "metastable_probes": res["n_metastable"],
            "decided_by": "; ".join(deciders), "wall_s": time.perf_counter() - t0}


def tune_delay(stages: int, server: str, quick: bool, seed: int) -> tuple[float, pd.DataFrame]:
    windows = study.window_candidates(MODEL, DEVICE)
    if quick:
        windows = windows[1:2]
    stack, engine = SERVERS[server]
    kw = {**(QUICK if quick else dict(min_duration_s=TUNE_PROBE_S, trigger="none")), "confirm_factor": 0}
    rows = []
    for w in windows:
        res = capacity(config({"name": "delaybatch", "max_queue_delay_ms": w}, stages, seed), SLO_MS,
                       percentile=99.0, stack=stack, engine=engine, hi=TOP_FACTOR * TARGET_QPS, max_doublings=0,
                       workers=1, **kw)
        rows.append({"server": server, "stack": res["stack"], "stages": stages, "window_ms": w,
                     "capacity_qps": res["capacity_qps"], "probe_s": kw["min_duration_s"]})
    df = pd.DataFrame(rows)
    best = df.sort_values(["capacity_qps", "window_ms"], ascending=[False, True]).iloc[0]["window_ms"]
    df["best"] = df["window_ms"] == best
    return float(best), df


def check(policy: dict, stages: int, server: str, rate: float, seed: int, quick: bool, long: bool = False) -> dict:
    """One GPU at ``rate`` with another seed: one probe long (60 s of arrivals; 1,000 queries quick) and again from a
    backlog of one SLO of arrivals, or (``long``) ``CONFIRM_FACTOR`` x that without the backlog; its verdict
    (dvasim/reporting/verdict.py)."""
    stack, engine = SERVERS[server]
    cfg = config(policy, stages, seed)
    n = 1000 if quick else max(1000, math.ceil(rate * MIN_DURATION_S))
    if long:
        n *= CONFIRM_FACTOR
    cfg = {**cfg, "workload": {**cfg["workload"], "rate_qps": rate, "n_queries": n,
                               "seed": seed + (202 if long else 101)},
           "qos": {**cfg.get("qos", {}), "trigger": "none" if long else "backlog"}}
    s = dvasim.run(cfg, progress=False, stack=stack, engine=engine).summary
    return {"rate_qps": rate, "n_queries": n, "verdict": s["verdict"], "p99_ms": s["p99_latency_ms"],
            "mean_ms": s["mean_latency_ms"], "mean_batch": s["mean_exit_batch_size"]}


def gpu_count(policy: dict, stages: int, server: str, first: int, seed: int, quick: bool) -> tuple[int, dict]:
    """The smallest count of GPUs whose share of the target holds, from the search's ``first`` (as
    :func:`dvasim.studies.plan.confirmed_count`: up while a count fails, then down while the one below holds). A
    count holds when one GPU at ``5000 / count`` is stable for one probe's length, from empty and from a backlog
    (:func:`check`), and then for ``CONFIRM_FACTOR`` x that (quick: the first only). Returns the count and each
    tried count's checks."""
    tried: dict[int, dict] = {}

    def holds(g: int) -> bool:
        if g not in tried:
            c = check(policy, stages, server, TARGET_QPS / g, seed, quick)
            t = {"check": c}
            if c["verdict"] == "stable" and not quick:
                t["long"] = check(policy, stages, server, TARGET_QPS / g, seed, quick, long=True)
            t["holds"] = all(v["verdict"] == "stable" for v in t.values())
            tried[g] = t
        return tried[g]["holds"]

    g = first
    while not holds(g) and g < 4 * first:
        g += 1
    while g > 1 and holds(g - 1):
        g -= 1
    if g > 1:
        holds(g - 1)  # reported beside the answer: one GPU fewer fails
    return g, tried


def tried_text(tried: dict) -> str:
    """``"1: over-SLO; 2: stable, 600 s stable"``: each tried count's verdicts."""
    def one(t: dict) -> str:
        c = t["check"]
        out = f"{c['verdict']} ({c['n_queries'] / c['rate_qps']:.0f} s, p99 {c['p99_ms']:.3g} ms)"
        if "long" in t:
            lg = t["long"]
            out += f", then {lg['verdict']} ({lg['n_queries'] / lg['rate_qps']:.0f} s, p99 {lg['p99_ms']:.3g} ms)"
        return out
    return "; ".join(f"{g}: {one(t)}" for g, t in sorted(tried.items()))


SEARCH_KEYS = ("window_ms", "stack", "capacity_qps", "sustained_qps", "first_fail_qps", "top_exceeded", "probes",
               "metastable_probes", "decided_by", "wall_s")


def one_config(job: tuple, progress=None) -> tuple[dict, pd.DataFrame | None]:
    """One row of the table: (server, stages, policy name, quick, seed, searched) -> (row, window tuning or None);
    ``searched``: this row's search from an earlier run (``--searched``), or None to search."""
    server, stages, name, quick, seed, searched = job
    pol: dict = {"name": name}
    window, tuned = math.nan, None
    if searched is not None:
        r = {k: searched[k] for k in SEARCH_KEYS if k in searched}
        window = float(r.pop("window_ms", math.nan))
        if name == "delaybatch":
            pol["max_queue_delay_ms"] = window
    else:
        if name == "delaybatch":
            window, tuned = tune_delay(stages, server, quick, seed)
            pol["max_queue_delay_ms"] = window
        r = one_gpu(pol, stages, server, quick, seed)
    t0 = time.perf_counter()
    first = math.ceil(TARGET_QPS / r["sustained_qps"]) if r["sustained_qps"] > 0 else math.inf
    row = {"server": server, "stages": stages, "policy": name, "window_ms": window, **r, "gpus_searched": first}
    if math.isfinite(first):
        gpus, tried = gpu_count(pol, stages, server, first, seed, quick)
        row["gpus"] = gpus
        for key, g in (("at", gpus), ("below", gpus - 1)):
            if g in tried:
                t = tried[g]
                last = t.get("long", t["check"])
                row.update({f"{key}_holds": t["holds"], f"{key}_check_verdict": t["check"]["verdict"],
                            f"{key}_verdict": last["verdict"], f"{key}_p99_ms": last["p99_ms"],
                            f"{key}_mean_batch": last["mean_batch"], f"{key}_queries": last["n_queries"]})
        row["tried"] = tried_text(tried)
    else:
        row["gpus"] = math.inf
    row["confirm_wall_s"] = time.perf_counter() - t0
    print(f"{server:14s} {stages} stages {name:10s} capacity {r['capacity_qps']:8.1f} sustained "
          f"{r['sustained_qps']:8.1f} qps -> {first} GPUs searched, {row['gpus']} confirmed: {row.get('tried', '-')}",
          flush=True)
    return row, tuned


def gpus_verdict(row: dict) -> str:
    """A stack / policy's verdict for the figure: ``unstable`` when no GPU count held (``gpus`` infinite, or its
    long run did not hold), ``metastable`` when its capacity search met metastable rates (``metastable_probes``:
    rates it did not recover at from a backlog), else ``stable``."""
    gpus = pd.to_numeric(pd.Series([row.get("gpus")]), errors="coerce").iloc[0]
    if not (gpus == gpus and math.isfinite(gpus)) or str(row.get("at_holds")).strip().lower() == "false":
        return "unstable"
    return common.row_verdict({"n_metastable": row.get("metastable_probes")})


def plot(df: pd.DataFrame, path: Path, device: str = DEVICE) -> None:
    """H100s needed per serving stack and policy, one panel per stage count; a bar whose capacity search met
    metastable rates (or whose count did not hold) carries its verdict's marker. The title names the model, the
    ``device``, the stacks, the policies and the load."""
    plt, sns = common.plt_sns()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.4), sharey=True)
    order = [s for s in SERVERS if s in set(df["server"])]
    hue = [p for p in POLICIES if p in set(df["policy"])]
    width = 0.8 / max(len(hue), 1)  # seaborn's dodged bars: 0.8 wide in all, one slot per policy
    for ax, st in zip(axes, STAGES):
        d = df[df.stages == st]
        sns.barplot(data=d, x="server", y="gpus", hue="policy", ax=ax, order=order, hue_order=hue,
                    palette=common.policy_colours(hue), saturation=1)
        for cont in ax.containers:
            ax.bar_label(cont, fmt="%d", fontsize=7)
        ax.set_yscale("log")
        ax.set(xlabel="serving stack", ylabel=f"H100s for {TARGET_QPS:,.0f} qps, p99 <= {SLO_MS:g} ms",
               title=f"{MODEL}, {st} stages")
        ax.tick_params(axis="x", labelrotation=15)
        rows = [r for r in d.to_dict("records") if r["server"] in order and r["policy"] in hue]
        counts = common.mark_verdicts(ax, [order.index(r["server"]) - 0.4 + width * (hue.index(r["policy"]) + 0.5)
                                           for r in rows], [r["gpus"] for r in rows], [gpus_verdict(r) for r in rows])
        common.marked_note(ax, counts, "marked (its capacity search met metastable rates)")
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    common.verdict_legend(axes[-1], "policy")
    what = common.context(df, device, model=MODEL, policy=hue)
    fig.suptitle(f"One question under each serving stack: how many GPUs? (fitted engine: experiments/h100_fit, "
                 f"stack 'custom')\n{what}\nload: Poisson, {TARGET_QPS:,.0f} queries/s shared equally by the GPUs; "
                 f"p99 <= {SLO_MS:g} ms; probes of 60 s, trigger-tested")
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)

def main(argv=None) -> dict[str, pd.DataFrame]:
    from dvasim.studies.parallel import map_jobs

    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=None, help="processes for the configs (default: one per core)")
    p.add_argument("--searched", type=Path, default=None,
                   help="an earlier run's stack_question.csv (same seed): reuse its searches, run the GPU counts' checks")
    args = common.parse(p, argv)
    if args.stack is not None:
        raise SystemExit("stack_question.py runs every stack; --stack does not apply")
    watch = common.Stopwatch()
    from dvasim.compiled import compiled_modules

    print("core:", "compiled (mypyc)" if all(compiled_modules().values()) else "pure Python", flush=True)
    quick = args.quick
    servers = list(SERVERS)
    stages_list = (4,) if quick else STAGES
    policies = ("zerobatch", "dvabatch") if quick else POLICIES
    earlier = {}
    if args.searched is not None:
        for rec in pd.read_csv(args.searched).to_dict("records"):
            earlier[(rec["server"], int(rec["stages"]), rec["policy"])] = rec
    jobs = [(server, stages, name, quick, args.seed, earlier.get((server, stages, name)))
            for server in servers for stages in stages_list for name in policies]
    out = map_jobs(one_config, jobs, workers=1 if quick else args.workers)
    df = pd.DataFrame([row for row, _ in out])
    tunings = [t for _, t in out if t is not None]
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
