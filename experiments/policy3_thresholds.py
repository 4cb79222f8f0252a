"""Policy III's default thresholds, swept (issue 33, item 3): DVABatch as described stretches the latest batch only
while it was handed to a stage below ``max_stretch_stage`` and processed less than ``t_comp_wait_ms``, both derived
from the table (``ceil(S / 2)`` and those stages' time at the stretch cap; ``dvasim/policies/dvabatch.py``), as the
authors' backend checks fixed thresholds (``lego_schedule.h:633-636``). This sweep shows what other values give.

For each model whose identified policies include *load* (Policy III on: ResNet152, VGG19, LinkNet, UNet on the Titan
RTX tables) at the low / medium / high loads of ``experiments/results/paper_rerun/described-current/calibration.csv``
(fractions of DelayBatch's peak on today's Triton, the stack ``triton-tensorrt``), Poisson runs of 5,000 queries
(seed 1) with: the default; every ``max_stretch_stage`` in 1..S with ``t_comp_wait_ms`` = 0.5, 1 and 2 x the
derived value; the QoS rule (``t_comp_wait_rule = "qos"``, the default before issue 33); and no stretch
(``stretch = false``). Writes ``policy3_thresholds.csv`` (one row per run) and prints each setting's mean latency
relative to the default, averaged over models and loads, and the best setting per model and load.

    python experiments/policy3_thresholds.py [--quick] [--out DIR] [--models ...] [--workers 2]
"""

from __future__ import annotations

import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from dvasim.studies import evaluation as study  # noqa: E402

CALIB = common.RESULTS / "paper_rerun" / "described-current" / "calibration.csv"
STACK = "triton-tensorrt"
SCALES = (0.5, 1.0, 2.0)
MODELS = ("resnet152", "vgg19", "linknet", "unet")


def _run(job):
    model, load, rate, label, policy, n = job
    cfg = study.make_config(model, {"name": "dvabatch", **policy}, {"kind": "poisson", "rate_qps": rate,
                                                                     "n_queries": n, "seed": 1}, stack=STACK)
    r = study.run_config(cfg)
    s = r.summary
    return {"model": model, "load": load, "offered_qps": rate, "setting": label,
            "max_stretch_stage": r.config["policy"].get("max_stretch_stage"),
            "t_comp_wait_ms": r.config["policy"].get("t_comp_wait_ms"),
            "mean_latency_ms": s["mean_latency_ms"], "p99_latency_ms": s["p99_latency_ms"],
            "n_stretch": s["n_stretch"], "throughput_qps": s["throughput_qps"], "stack": s["stack"]}


def main(argv=None) -> dict[str, pd.DataFrame]:
    p = common.parser(__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=2)
    args = common.parse(p, argv)
    models = args.models or list(MODELS)
    n = 1000 if args.quick else 5000
    calib = pd.read_csv(CALIB).set_index("model")
    jobs = []
    for model in models:
        stages = study.MODELS[model]["stages"]
        peak = float(calib.loc[model, "peak_qps_delaybatch"])
        derived = study.run_config(study.make_config(model, {"name": "dvabatch"}, {
            "kind": "poisson", "rate_qps": 1.0, "n_queries": 2, "seed": 1}, stack=STACK)).config["policy"]
        if "load" not in derived["policies"]:
            continue
        base_ms = float(derived["t_comp_wait_ms"])
        for load, frac in study.LOADS.items():
            rate = frac * peak
            settings = [("default", {}), ("qos rule", {"t_comp_wait_rule": "qos"}),
                        ("no stretch", {"stretch": False})]
            for stage in range(1, stages + 1):
                for scale in SCALES:
                    settings.append((f"stage<{stage}, {scale:g}x wait",
                                     {"max_stretch_stage": stage, "t_comp_wait_ms": scale * base_ms}))
            jobs += [(model, load, rate, label, pol, n) for label, pol in settings]
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as ex:
        rows = list(ex.map(_run, jobs))
    df = pd.DataFrame(rows)
    common.save(df, args.out, "policy3_thresholds.csv")
    ref = df[df["setting"] == "default"].set_index(["model", "load"])["mean_latency_ms"]
    df["rel_to_default"] = df["mean_latency_ms"] / df.set_index(["model", "load"]).index.map(ref)
    avg = df.groupby("setting", sort=False)["rel_to_default"].mean().sort_values()
    common.show(avg.reset_index(), "mean latency relative to the default, averaged over models and loads")
    best = df.loc[df.groupby(["model", "load"])["mean_latency_ms"].idxmin(), ["model", "load", "setting",
                                                                              "rel_to_default"]]
    common.show(best, "the best setting per model and load (its mean latency relative to the default)")
    return {"runs": df, "average": avg.reset_index()}


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
