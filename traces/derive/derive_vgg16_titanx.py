"""Derive traces/default/vgg16_titanx_4stages.csv from the Nexus TITAN X (Pascal) VGG16 profile.

Run by a human from the repository root (it reads the shared data directory, which the project never reads
at run or test time):

    .venv/bin/python traces/derive/derive_vgg16_titanx.py [path/to/caffe_vgg16_1.txt] [--out PATH]

What is measured and what is modelled
-------------------------------------
* Measured: the whole-model forward latency of Caffe VGG16 (224x224 input) for each batch size on an NVIDIA
  TITAN X (Pascal), from the Nexus serving system's model database (uwsampl/nexus,
  tests/data/model_db/profiles/TITAN_X_(Pascal)/caffe_vgg16_1.txt). Nexus' profiler
  (tools/profiler/profiler.cpp) times ``ModelExecutor::Execute()`` for a whole batch: mean of 10 runs after
  4 warm-up runs, in microseconds; image decoding/preprocessing is timed separately and is NOT included.
* Modelled: the split of that latency into 4 stages. VGG16's 16 weight layers (13 conv + 3 fc) are cut,
  in topological order, into 4 contiguous stages as time-evenly as possible (the DVABatch paper, Sec. 7.1:
  operators are "time-evenly assigned to the stages in the topological order"), assuming each layer's time
  is proportional to its FLOPs (computed analytically below; pooling/ReLU/softmax are not counted). Every
  batch size is split in the same proportions. The per-stage numbers are therefore NOT measured.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from dvasim.model.table import LatencyTable  # noqa: E402

DEFAULT_SRC = REPO.parent / "shared/data/latency/nexus_profiles_titanx_pascal/caffe_vgg16_1.txt"
DEFAULT_OUT = REPO / "traces/default/vgg16_titanx_4stages.csv"
N_STAGES = 4
MAX_BATCH = 64
SOURCE = (
    "uwsampl/nexus tests/data/model_db/profiles/TITAN_X_(Pascal)/caffe_vgg16_1.txt "
    "(commit 27fd0283b937aa764475a5c097eda26251ca6a28)"
)
LICENCE = "BSD-3-Clause, Copyright (c) 2018-2020 University of Washington; full notice reproduced in traces/README.md"


def vgg16_layers(h: int = 224, w: int = 224) -> list[tuple[str, float]]:
    """(name, FLOPs) of VGG16's 16 weight layers for one h x w RGB image; FLOPs = 2 x multiply-accumulates."""
    cfg = [[64, 64], [128, 128], [256, 256, 256], [512, 512, 512], [512, 512, 512]]
    layers: list[tuple[str, float]] = []
    c_in = 3
    for block, outs in enumerate(cfg, start=1):
        for j, c_out in enumerate(outs, start=1):
            macs = h * w * c_out * c_in * 3 * 3  # 3x3 conv, stride 1, pad 1: output is h x w
            layers.append((f"conv{block}_{j}", 2.0 * macs))
            c_in = c_out
        h, w = h // 2, w // 2  # 2x2 max pool, stride 2
    fc_in = c_in * h * w  # 512 * 7 * 7 = 25088
    for name, n_out in (("fc6", 4096), ("fc7", 4096), ("fc8", 1000)):
        layers.append((name, 2.0 * fc_in * n_out))
        fc_in = n_out
    return layers


def time_even_cuts(costs: list[float], n_stages: int) -> tuple[int, ...]:
    """Indices where stages 1..n-1 start, minimising the largest stage (ties: smallest sum of squares)."""
    n = len(costs)
    best = None
    for cuts in itertools.combinations(range(1, n), n_stages - 1):
        bounds = (0, *cuts, n)
        sums = [sum(costs[a:b]) for a, b in itertools.pairwise(bounds)]
        score = (max(sums), sum(s * s for s in sums))
        if best is None or score < best[0]:
            best = (score, cuts)
    return best[1]


def read_nexus_profile(path: Path) -> pd.DataFrame:
    """The 'Forward latency' block of a Nexus profile file as (batch, latency_ms)."""
    lines = path.read_text().splitlines()
    start = lines.index("batch,latency(us),std(us),memory(B)") + 1
    rows = []
    for line in lines[start:]:
        parts = line.split(",")
        if len(parts) != 4 or not parts[0].isdigit():
            break
        rows.append((int(parts[0]), float(parts[1]) / 1000.0))
    return pd.DataFrame(rows, columns=["batch", "latency_ms"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", nargs="?", default=str(DEFAULT_SRC))
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    args = ap.parse_args(argv)
    src = Path(args.src)
    prof = read_nexus_profile(src)
    long_csv = src.parent / "nexus_forward_latency_long.csv"
    if long_csv.is_file():  # cross-check against the long-form copy
        lf = pd.read_csv(long_csv)
        lf = lf[lf["model"] == "caffe:vgg16:1"].set_index("batch")["latency_ms"]
        diff = (prof.set_index("batch")["latency_ms"] - lf.reindex(prof["batch"]).to_numpy()).abs().max()
        assert diff < 1e-9, f"profile and long CSV disagree by {diff} ms"
        print(f"cross-check vs {long_csv.name}: max |diff| = {diff:.3g} ms")

    prof = prof[prof["batch"] <= MAX_BATCH]
    assert prof["batch"].tolist() == list(range(1, MAX_BATCH + 1)), "expected every batch size 1..64"

    layers = vgg16_layers()
    flops = [f for _, f in layers]
    cuts = time_even_cuts(flops, N_STAGES)
    bounds = (0, *cuts, len(layers))
    total_flops = sum(flops)
    shares = [sum(flops[a:b]) / total_flops for a, b in itertools.pairwise(bounds)]
    desc = []
    for s, (a, b) in enumerate(itertools.pairwise(bounds)):
        desc.append(f"stage {s} = layers {a}-{b - 1} ({layers[a][0]}..{layers[b - 1][0]}, {shares[s]:.4f} of FLOPs)")
    print(f"VGG16 FLOPs (224x224, batch 1): {total_flops / 1e9:.3f} GFLOPs")
    print("\n".join(desc))

    rows = []
    for bs, tot in zip(prof["batch"], prof["latency_ms"], strict=True):
        parts = [round(tot * sh, 6) for sh in shares[:-1]]
        parts.append(round(tot - sum(parts), 6))  # last stage takes the remainder: stage sums equal the measurement
        for s, lat in enumerate(parts):
            rows.append((s, int(bs), lat))
    df = pd.DataFrame(rows, columns=["stage", "batch_size", "latency_ms"])
    prov = {
        "source": SOURCE,
        "licence": LICENCE,
        "gpu": "NVIDIA TITAN X (Pascal)",
        "model": "Caffe VGG16 (caffe:vgg16:1), 224x224 RGB input",
        "measured": "whole-model forward latency per batch size (Nexus profiler: mean of 10 timed ModelExecutor::Execute "
        "calls after 4 warm-ups; preprocessing excluded), batch sizes 1..64",
        "modelled": "the split into 4 stages is NOT measured: each batch's latency is divided in proportion to the "
        "analytic FLOPs of the layers in each stage (conv/fc only; pooling, ReLU and softmax ignored)",
        "stages": "; ".join(desc) + "; layer indices 0-15 = conv1_1..conv5_3 (0-12), fc6, fc7, fc8 (13-15)",
        "cut_rule": "contiguous layers in topological order, cut to minimise the largest stage's FLOPs (time-even, DVABatch Sec. 7.1)",
        "derived_by": "traces/derive/derive_vgg16_titanx.py",
        "date": datetime.date.today().isoformat(),
        "units": "latency_ms in milliseconds; values rounded to 1 ns, last stage = measured total minus the others",
    }
    table = LatencyTable.from_frame(df, provenance=prov, name="vgg16_titanx_4stages")
    table.save(args.out)
    print(f"wrote {args.out}: {table}")


if __name__ == "__main__":
    main()
