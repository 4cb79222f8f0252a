"""No collapse where multi-entry alone holds (issue 33, item 6): BERT-base on the H100 tables (the ``cudagraph``
stack, GLUE RTE lengths, 2 stages) at 4,500 QPS, 100,000 Poisson queries, seeds 1-3, under DVABatch as described,
multi-entry pipelining alone, DVABatch as built and ZeroBatch. Before issue 33 DVABatch fell to batches of about
1.7 and served 1,357-1,534 QPS here (Policy I's clusters ignored the host's interpreter lock).

Writes ``bert_h100_collapse.csv`` (one row per system and seed) and prints it.

    python experiments/bert_h100_collapse.py [--quick] [--out DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import dvasim  # noqa: E402

SYSTEMS = {"dvabatch": {"name": "dvabatch"}, "multi-entry only": {"name": "dvabatch", "policies": []},
           "dvabatch-built": {"name": "dvabatch-built"}, "zerobatch": {"name": "zerobatch"}}


def main(argv=None) -> dict[str, pd.DataFrame]:
    p = common.parser(__doc__.split("\n")[0])
    args = common.parse(p, argv)
    n = 10_000 if args.quick else 100_000
    rows = []
    for label, policy in SYSTEMS.items():
        for seed in (1, 2, 3):
            cfg = {"model": {"name": "bert_base", "device": "h100", "stages": 2}, "policy": policy,
                   "workload": {"kind": "poisson", "rate_qps": 4500.0, "n_queries": n, "seed": seed,
                                "seq_len_dist": "glue:RTE"}}
            s = dvasim.run(cfg).summary
            rows.append({"system": label, "seed": seed, "stack": s["stack"], "n_queries": n,
                         "throughput_qps": s["throughput_qps"], "mean_latency_ms": s["mean_latency_ms"],
                         "p99_latency_ms": s["p99_latency_ms"], "mean_batch": s["n_queries"] / s["n_batches"],
                         "stable": s["stable"]})
    df = pd.DataFrame(rows)
    common.save(df, args.out, "bert_h100_collapse.csv")
    common.show(df, "BERT-base, H100 tables, 4,500 QPS")
    return {"runs": df}


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
