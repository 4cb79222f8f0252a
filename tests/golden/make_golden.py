"""Write ``golden.npz``: every query's record of every case in :mod:`cases`, from the engine of this checkout.

    python tests/golden/make_golden.py     # from the project root; records the commit in golden.json

Run it only when results change on purpose, and say in the commit which cases changed and why.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cases import CASES  # noqa: E402

# columns not compared: derived ones (latency, queue), and the payload times, recorded since the golden files were
# made (tests/reporting/test_payload_records.py checks them; nothing they hold feeds back into a run)
NOT_COMPARED = ("latency_ms", "queue_ms", "payload_ms", "instance_ms")


def frame_arrays(df) -> dict[str, np.ndarray]:
    cols = [c for c in df.columns if c.endswith("_ms") or c in ("query_id", "seq_len", "batch_id", "exit_batch_id",
                                                                 "exit_batch_size")]
    cols = [c for c in cols if c not in NOT_COMPARED]
    return {c: df[c].to_numpy() for c in cols}


def main() -> None:
    import dvasim

    out, meta = {}, {}
    for name, cfg in CASES.items():
        res = dvasim.run(cfg)
        assert res.stuck is None, (name, res.stuck)
        for col, arr in frame_arrays(res.queries).items():
            out[f"{name}/{col}"] = arr
        meta[name] = {"n_queries": int(res.summary["n_queries"]), "mean_latency_ms": res.summary["mean_latency_ms"],
                      "n_split": res.summary["n_split"], "n_stretch": res.summary["n_stretch"]}
    np.savez_compressed(HERE / "golden.npz", **out)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=HERE).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "dvasim"], capture_output=True, text=True,
                                cwd=HERE.parent.parent).stdout.strip())
    (HERE / "golden.json").write_text(json.dumps({"engine_commit": commit, "engine_dirty": dirty, "cases": meta},
                                                 indent=1) + "\n")
    print(f"{len(CASES)} cases from {commit}{' (dirty)' if dirty else ''}")


if __name__ == "__main__":
    main()
