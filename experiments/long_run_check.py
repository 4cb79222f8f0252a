"""Do the answers hold in a run ten times longer? Issue 34's cases, under the old probe rule and the new one.

Each case is a capacity or a GPU count that a short probe gave and a longer run overturned:

* ``titanrtx_dvabatch``: BERT-base on the Titan RTX table (4 stages, GLUE RTE lengths), DVABatch, p99 <= 50 ms: the
  old capacity search said 829 qps (5 seeds: 775 [712, 838]), and 30,000-query runs were over the SLO at 750 qps;
* ``h100_notebook``: BERT-base on the H100 table (2 stages), p99 <= 200 ms, as ``notebooks/policy_for_bert_on_h100``
  searches it (the old notebook said DVABatch holds 6,128 qps; at 0.9 of that, one seed collapsed);
* ``h100_plan``: the same model at 5,000 qps under a 50 ms p99, ZeroBatch and DVABatch, 3 seeds: ``plan`` (the
  old plan said one ZeroBatch GPU; one ZeroBatch GPU is over the SLO in 100,000-query runs).

For every capacity, both rules' answers are then run at ``CHECK_FACTOR`` (10) times the new rule's probe length
(its ``min_duration_s``: 600 s of arrivals, LoadGen's Server rule), once per seed (the old answer with one), each
with the trigger test, and the verdicts are
written down (:mod:`dvasim.reporting.verdict`). The plan case runs ``dvasim.studies.plan.plan``, whose answer is
confirmed by its own long runs (10x, at the count and the one below).

Writes ``long_run_check.csv`` (one row per case, rule and seed of the check) and ``long_run_check_plan.json``.

The new rule's capacity is confirmed by ``capacity``'s own long runs (``confirm_factor`` = 10, fresh seeds, stepping
down while one fails) before the check runs here; ``capacity_searched_qps`` is the searches' answer.

Usage: ``python experiments/long_run_check.py [--quick] [--out DIR] [--cases a,b] [--rules old,new]``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import dvasim  # noqa: E402
from dvasim.studies import evaluation as study  # noqa: E402
from dvasim.studies.capacity import MIN_DURATION_S, capacity  # noqa: E402
from dvasim.studies.plan import plan  # noqa: E402

CHECK_FACTOR = 10
CHECK_SEEDS = (101, 102, 103)
OLD_RULE = dict(confidence=0.95, min_duration_s=0.0, min_queries=1000, max_queries=64_000, trigger="none")


def bert(device: str, stages: int, policy: str, slo_ms: float) -> dict:
    cfg = study.make_config("bert_base", {"name": policy}, {"kind": "poisson", "rate_qps": 100.0, "n_queries": 1000,
                                                             "seed": 1}, device=device, stages=stages, qos_ms=slo_ms)
    cfg["workload"]["seq_len_dist"] = "glue:RTE"
    return cfg


CASES = {  # name -> (config, slo_ms, seeds of the search, search settings)
    "titanrtx_dvabatch": (lambda: bert("titanrtx", 4, "dvabatch", 50.0), 50.0, 5, {}),
    "h100_notebook_dvabatch": (lambda: bert("h100", 2, "dvabatch", 200.0), 200.0, 1, {"resolution": 0.05}),
}


def check_runs(cfg: dict, rate: float, slo_ms: float, n: int, seeds=CHECK_SEEDS) -> list[dict]:
    """Runs of ``n`` queries at ``rate``, one per check seed, each with the trigger test (its run a tenth as long):
    their verdicts. (The old rule's answers are checked with one seed: enough to show one flip.)"""
    rows = []
    for seed in seeds:
        trial = {**cfg, "workload": {**cfg["workload"], "rate_qps": rate, "n_queries": n, "seed": seed},
                 "qos": {"target_ms": slo_ms, "trigger": "backlog", "trigger_queries": max(2, n // CHECK_FACTOR)}}
        s = dvasim.run(trial, progress=False).summary
        rows.append({"check_seed": seed, "check_queries": n, "verdict": s["verdict"],
                     "p99_latency_ms": s["p99_latency_ms"], "throughput_qps": s["throughput_qps"],
                     "mean_exit_batch_size": s["mean_exit_batch_size"]})
    return rows


def capacity_case(name: str, quick: bool, rules=("old", "new")) -> list[dict]:
    make, slo, seeds, kw = CASES[name]
    cfg = make()
    seeds = 2 if quick else seeds
    kw = {**kw, "resolution": 0.1} if quick else kw
    rows = []
    for rule, rule_kw in (("old", OLD_RULE), ("new", {})):
        if rule not in rules:
            continue
        t0 = time.perf_counter()
        res = capacity(cfg, slo, seeds=seeds, **kw, **rule_kw)
        wall = time.perf_counter() - t0
        cap = res["capacity_qps"]
        searched = res.get("capacity_searched_qps", cap)  # the new rule confirms its answer by its own long runs
        if searched != cap:
            print(f"{name}: {rule} rule: the searches said {searched:.1f} qps; capacity's long runs hold from "
                  f"{cap:.1f}", flush=True)
        n = int(CHECK_FACTOR * cap * (1.0 if quick else MIN_DURATION_S))
        print(f"{name}: {rule} rule: {cap:.1f} qps {res['capacity_interval']} ({wall:.0f} s); checking at "
              f"{n:,} queries", flush=True)
        for r in check_runs(cfg, cap, slo, n, CHECK_SEEDS if rule == "new" else CHECK_SEEDS[:1]):
            rows.append({"case": name, "rule": rule, "capacity_qps": cap, "capacity_searched_qps": searched,
                         "capacity_lo": res["capacity_interval"]["lo"], "capacity_hi": res["capacity_interval"]["hi"],
                         "search_wall_s": wall, "n_metastable": res.get("n_metastable", 0), **r})
            print(f"  seed {r['check_seed']}: {r['verdict']}, p99 {r['p99_latency_ms']:.4g} ms, "
                  f"{r['throughput_qps']:.0f} qps served", flush=True)
    return rows


def plan_case(quick: bool, out: Path) -> list[dict]:
    cfg = bert("h100", 2, "zerobatch", 50.0)
    t0 = time.perf_counter()
    kw = dict(min_duration_s=1.0, resolution=0.1) if quick else {}
    res = plan(cfg, 5000.0, 50.0, policies=["zerobatch", "dvabatch"], seeds=2 if quick else 3, headroom=False,
               **kw)
    wall = time.perf_counter() - t0
    from dvasim.cli.capacity import strict_json

    (out / "long_run_check_plan.json").write_text(json.dumps(strict_json(res), indent=1, default=str) + "\n")
    rows = []
    for pol, p in res["by_policy"].items():
        print(f"h100_plan: {pol}: {p['replicas']} replicas (probes: {p['replicas_by_seed']}); {wall:.0f} s",
              flush=True)
        for c in p["confirmations"]:
            for r in c["runs"]:
                rows.append({"case": "h100_plan_" + pol, "rule": "new", "replicas": c["replicas"],
                             "answer": p["replicas"], "check_seed": r["seed"], "check_queries": r["n_queries"],
                             "verdict": r["verdict"], "p99_latency_ms": r["p99_latency_ms"],
                             "throughput_qps": r["throughput_qps"], "search_wall_s": wall})
                print(f"  {c['replicas']} replicas, seed {r['seed']}: {r['verdict']}, p99 "
                      f"{r['p99_latency_ms']:.4g} ms", flush=True)
    return rows


def main(argv=None) -> pd.DataFrame:
    ap = common.parser(__doc__.splitlines()[0])
    ap.add_argument("--cases", default=None, help=f"a,b: some of {', '.join([*CASES, 'h100_plan'])}")
    ap.add_argument("--rules", default="old,new", help="old,new (default both): the capacity cases' rules to run")
    args = common.parse(ap, argv)
    out = args.out
    names = [*CASES, "h100_plan"] if args.cases is None else args.cases.split(",")
    rows = []
    for name in names:  # the table written after every case: a long run cut short keeps what it finished
        rows += plan_case(args.quick, out) if name == "h100_plan" else capacity_case(
            name, args.quick, tuple(args.rules.split(",")))
        pd.DataFrame(rows).to_csv(out / "long_run_check.csv", index=False)
    print(f"wrote {out / 'long_run_check.csv'}")
    return pd.DataFrame(rows)


if __name__ == "__main__":
    main()
