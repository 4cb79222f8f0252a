"""Derive launch-cost tables (dvasim.server.host.LaunchTable format) and GPU-time stage tables from the H100 stage
measurements.

    python traces/derive/derive_h100_launch.py SHARED/data/gpu-h100/stage_times.csv

Writes traces/h100_replays/<model>_launch.csv for resnet152 and bert_base: `eager_launch_ms` (host time until an
eager stage call returned, before synchronising; every batch size 1..16, 24, 32, BERT lengths 32-256) as
modules = "eager" and `ts_launch_ms` (the same for the TorchScript stage; batch 1, 4, 16, BERT length 64 only) as
modules = "torchscript". Medians of 10 calls after 3 warm-ups, measured on one NVIDIA H100 80GB HBM3 host
(16 cores, torch 2.11.0+cu130) with dvasim at commit 15db935; host timings moved by up to 2x between runs.
Also writes traces/h100_replays/<model>_gpu_table.csv: `graph_ms` (each stage captured as a CUDA graph, GPU time
of back-to-back replays between CUDA events) as a LatencyTable, the `[engine.host] gpu_table` of dvasim fit
--gpu-table.
"""

import sys
from pathlib import Path

import pandas as pd

OUT = Path(__file__).resolve().parents[1] / "h100_replays"


def main(src: str) -> None:
    df = pd.read_csv(src)
    for model in ("resnet152", "bert_base"):
        m = df[df.model == model]
        rows = []
        for kind, col in (("eager", "eager_launch_ms"), ("torchscript", "ts_launch_ms")):
            sub = m[m[col].notna()]
            for r in sub.itertuples(index=False):
                rows.append({"modules": kind, "stage": int(r.stage), "batch_size": int(r.batch_size),
                             "seq_len": "" if pd.isna(r.seq_len) else int(r.seq_len),
                             "launch_ms": round(float(getattr(r, col)), 4)})
        head = [
            "# source: derived by traces/derive/derive_h100_launch.py from the project's H100 measurements "
            "(stage_times.csv: eager_launch_ms, ts_launch_ms)",
            "# device name: NVIDIA H100 80GB HBM3 (16 host cores)",
            "# torch: 2.11.0+cu130", "# date: 2026-11-22", f"# model: {model} (full variant), 4 stages (h100 time-even)",
            "# statistic: median of 10 calls after 3 warm-ups; host time until the call returned, before synchronising",
            "# caveat: host timings moved by up to 2x between runs; torchscript only at batch 1, 4, 16 (BERT: length 64)",
        ]
        body = pd.DataFrame(rows).to_csv(index=False)
        (OUT / f"{model}_launch.csv").write_text("\n".join(head) + "\n" + body)
        cols = ["stage", "batch_size", "latency_ms"] if m["seq_len"].isna().all() else \
            ["stage", "batch_size", "seq_len", "latency_ms"]
        g = m.rename(columns={"graph_ms": "latency_ms"})
        if "seq_len" in cols:
            g = g.assign(seq_len=g["seq_len"].astype(int))
        g = g[cols].sort_values(cols[:-1])
        ghead = [
            "# source: derived by traces/derive/derive_h100_launch.py from the project's H100 measurements "
            "(stage_times.csv: graph_ms)",
            "# device name: NVIDIA H100 80GB HBM3", "# torch: 2.11.0+cu130", "# date: 2026-11-22",
            f"# model: {model} (full variant), 4 stages (h100 time-even, the replays' cut)",
            "# timer: each stage captured as a CUDA graph, 5 x 10 back-to-back replays between CUDA events; "
            "median of the per-replay means (GPU time, no host launch cost)",
        ]
        (OUT / f"{model}_gpu_table.csv").write_text("\n".join(ghead) + "\n" + g.to_csv(index=False))


if __name__ == "__main__":
    main(sys.argv[1])
