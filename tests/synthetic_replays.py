"""Writing synthetic replay folders (what ``dvasim replay --out DIR`` writes) for the fit's tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd


def write_replay(d: Path, rows: list[dict], t_end: float, rng: np.random.Generator, model: str, stages: int) -> Path:
    """``executions.csv`` from ``rows``, 200 queries arriving uniformly over ``[0, t_end)`` (seen 0.05 ms later,
    answered 5 ms later) and a ``config.toml`` replaying ``model`` in ``stages`` stages under ZeroBatch with
    TorchScript stages."""
    d.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(d / "executions.csv", index=False)
    arr = np.sort(rng.uniform(0, t_end, 200))
    pd.DataFrame({"arrival_ms": arr, "seen_ms": arr + 0.05, "finish_ms": arr + 5}).to_csv(d / "queries.csv",
                                                                                        index=False)
    (d / "config.toml").write_text(f'[model]\nname = "{model}"\ndevice = "h100"\nstages = {stages}\n'
                                   '[policy]\nname = "zerobatch"\n[replay]\nmodules = "torchscript"\n')
    return d
