"""The H100 replays' cases on today's defaults, and with the choices their engine files were fitted under pinned
(issue 46, item 3).

    python experiments/h100_fit/pinned_check.py [--out results/experiments/h100_fit]

``check.py``'s harness, with each case's config rebuilt on the current tree: the replay's config with
``[model] table = <model>_serving_table.csv`` and DVABatch's parameters as recorded (:func:`recorded_dvabatch`)
*less* ``cluster_host_cost``, which the configs leave to the policy's default (true since issue 33; the replays'
policy decided on the GPU's time alone). Two choices changed since the recording: that default, and the cut the
launch law is fitted through (``dvasim fit`` without ``--table`` takes the replays' ``[model] stages = 4`` as
today's zoo cuts it, 45/38/38/36 and 16/15/15/16 operators, not the replayed 39/39/40/39 and 15/16/16/15). Four
engines per model, fitted on the same ZeroBatch folders:

* ``defaults``: fitted at today's cut, the file's ``[pinned]`` dropped (a file written before pinning);
* ``cluster pinned``: the same fit, its ``[pinned]`` kept (it pins ``cluster_host_cost = false``);
* ``cut pinned``: fitted at the replayed cut (``--table``), ``[pinned]`` dropped;
* ``both pinned``: fitted at the replayed cut, ``[pinned]`` kept (what ``dvasim fit --table`` writes now).

Also the replays' own configs as recorded (``[model] name, device = "h100", stages = 4``, no table: the policy
decides on the zoo's table), with the ``defaults`` and the ``both pinned`` engines: the pinned file runs
``stages = 4`` at its fitted cut (``[pinned.model]``), the unpinned one where today's slicing puts it.

Scored as check.py scores (mean within 15%, p99 within 25%, throughput within 5%; noise cases left out). Writes
``pinned_check.csv`` (one row per engine and case; the engine files are scratch) and prints the counts (11 s on
2 cores). Results (2026-12, committed ``pinned_check.csv``): rebuilt configs 1 of 11 with the ``defaults`` engine,
4 with ``cluster pinned``, 3 with ``cut pinned``, 6 with ``both pinned`` (the same cases and errors as
``results.csv``); the configs as recorded, 3 of 11 with either engine.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd
import tomllib

from dvasim.fitting.check import TARGETS, case_config, is_noise, real_runs, recorded_dvabatch
from dvasim.fitting.fit import fit, table_operators, write_engine
from dvasim.fitting.logs import find_log, read_log_text

ROOT = Path(__file__).resolve().parents[2]
REPLAYS = ROOT / "traces" / "h100_replays"
ENGINES = {"defaults": (False, False), "cluster pinned": (False, True), "cut pinned": (True, False),
           "both pinned": (True, True)}  # (fitted at the replayed cut, [pinned] kept)


def rebuilt(folder: Path, table: Path) -> dict:
    """check.py's case config with ``cluster_host_cost`` left to the current default."""
    cfg = case_config(folder, table)
    cfg["policy"].pop("cluster_host_cost", None)
    return cfg


def as_recorded(folder: Path, table: Path) -> dict:
    """The replay's own config (its zoo ``[model]``), DVABatch's recorded parameters less ``cluster_host_cost``."""
    cfg = tomllib.loads(read_log_text(find_log(folder, "config.toml")))
    cfg = {k: v for k, v in cfg.items() if k != "replay"}
    cfg["_base_dir"] = str(folder.resolve())
    if cfg.get("policy", {}).get("name") == "dvabatch":
        rec = recorded_dvabatch(table, cfg["policy"].get("max_batch_size", 64))
        rec.pop("cluster_host_cost")
        cfg["policy"] = {**rec, **cfg["policy"]}
    return cfg


def engine(model: str, dirs: list[Path], at_cut: bool, pinned: bool, out: Path) -> Path:
    ops = table_operators(REPLAYS / f"{model}_serving_table.csv") if at_cut else None
    res = fit(dirs, operators=ops, operators_source="the serving table's cuts" if at_cut else None)
    if not pinned:
        res.pop("pinned")
    return write_engine(res, out / f"pinned_check_{model}_{int(at_cut)}{int(pinned)}.toml")


def score(cfg: dict, eng: Path, summary: Path, policy: str, load: float) -> dict:
    from dvasim.api import run

    res = run(cfg, engine=eng, progress=False).summary
    real = real_runs(summary, policy, load)
    row = {"policy": policy, "load": load}
    ok = True
    for k, tol in TARGETS.items():
        r = sum(real[k]) / len(real[k])
        row[f"err_{k}"] = (float(res[k]) - r) / r
        ok = ok and abs(row[f"err_{k}"]) <= tol
    row["verdict"] = "noise" if is_noise(real["mean_latency_ms"]) else ("within" if ok else "outside")
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(Path("results") / "experiments" / "h100_fit"))
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pinned-check-") as tmp:  # the engines: scratch files
        df = cases(Path(tmp))
    df.to_csv(out / "pinned_check.csv", index=False)
    for (configs, name), g in df.groupby(["configs", "engine"], sort=False):
        sc = g[g.verdict != "noise"]
        print(f"{configs:30s} {name:15s} {int((sc.verdict == 'within').sum())} of {len(sc)} within 15 / 25 / 5%; "
              f"median |error| throughput {sc.err_throughput_qps.abs().median():.1%}, mean "
              f"{sc.err_mean_latency_ms.abs().median():.1%}, p99 {sc.err_p99_latency_ms.abs().median():.1%}")
    return 0


def cases(out: Path) -> pd.DataFrame:
    """Every engine's row per case (engine files written to ``out``)."""
    rows = []
    for model in ("resnet152", "bert_base"):
        summary, table = REPLAYS / f"{model}_summary.json", REPLAYS / f"{model}_serving_table.csv"
        dirs = [d for d in sorted(REPLAYS.glob(f"{model}_zerobatch_*"))
                if not is_noise(real_runs(summary, "zerobatch", float(d.name.rsplit("_", 1)[1]))["mean_latency_ms"])]
        engines = {name: engine(model, dirs, *flags, out) for name, flags in ENGINES.items()}
        cases = [(f, pol, float(f.name.rsplit("_", 1)[1])) for pol in ("delaybatch", "dvabatch")
                 for f in sorted(REPLAYS.glob(f"{model}_{pol}_*"))]
        for name, eng in engines.items():
            for folder, pol, load in cases:
                rows.append({"configs": "rebuilt on the serving table", "engine": name, "case": folder.name,
                             **score(rebuilt(folder, table), eng, summary, pol, load)})
        for name in ("defaults", "both pinned"):
            for folder, pol, load in cases:
                rows.append({"configs": "as recorded (zoo model)", "engine": name, "case": folder.name,
                             **score(as_recorded(folder, table), engines[name], summary, pol, load)})
    return pd.DataFrame(rows)


if __name__ == "__main__":
    sys.exit(main())
