"""``dvasim fit`` on real Triton server runs (``dvasim triton`` folders): the serving stack of that server, written
as a stack file that pins every field (:func:`dvasim.server.stacks.stack_from_toml`), so ``dvasim run CONFIG
--stack FILE.toml`` (or the shipped ``triton-python-cpu``) predicts runs it has not seen.

What is fitted, from the records (:mod:`dvasim.engines.triton.engine`), and where it goes in the simulator's host
model (:mod:`dvasim.server.costs`, a batch thread that leaves the device idle between its batches, as the Python
backend's instance thread does):

* **entry** (``request_ms + request_per_row_ms * b``): from the moment an execution could have begun (its instance
  free, Triton's ``COMPUTE_END`` of the instance's previous batch, and a request of it queued, ``QUEUE_START``) to
  the device starting it: the batcher's and the instance thread's wake-ups, the backend's hand-off to the stub, the
  stub reading the requests' inputs. Least squares over every execution of a ZeroBatch run (a delay would hold a
  batch back on purpose) against its batch size ``b`` (each coefficient at least 0).
* **exit** (``sync_ms``, and a per-request part): from the device's end to ``COMPUTE_END``: the answers made and
  sent, the backend letting go of the batch. Least squares against the batch size over every execution; its
  intercept is ``sync_ms`` and its slope is added to ``request_per_row_ms`` (the stack's exit has no per-request
  term; both hold the instance before the batch's answers leave, so the sum is what a batch costs either way).
* **client path** (``client_path_ms``: 101 quantiles): what a request pays outside the batcher, on the way in (the
  client's send, gRPC, the front end: arrival to ``QUEUE_START``) and on the way out (``COMPUTE_END`` to the answer
  at the client; negative where the answer came first), pooled over every served query of every folder, clipped at
  0. The simulator draws it per query as ``[engine] admission_delay_ms``.
* the release: ``24.10`` (:mod:`dvasim.policies.triton_release`; the server's own).

The calibration set the shipped stack was fitted on (``experiments/validation/triton/``): ZeroBatch at three loads
and an idle probe. A fit reports its in-sample numbers beside the stack.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dvasim.errors import ConfigError

LEVELS = 101  # quantiles of the client path, evenly spaced in 0..1


def is_triton_folder(path: str | Path) -> bool:
    p = Path(path) / "summary.json"
    try:
        return json.loads(p.read_text(encoding="utf-8")).get("engine") == "triton"
    except (OSError, ValueError):
        return False


def load(folder: str | Path) -> tuple[pd.DataFrame, dict]:
    """A triton run's served queries and its summary."""
    f = Path(folder)
    for name in ("queries.parquet", "queries.csv.gz", "queries.csv"):
        if (f / name).exists():
            q = pd.read_parquet(f / name) if name.endswith(".parquet") else pd.read_csv(f / name)
            break
    else:
        raise ConfigError("fit", f"{f}: no queries.parquet or queries.csv(.gz); give dvasim triton folders")
    summary = json.loads((f / "summary.json").read_text(encoding="utf-8"))
    return q, summary


def batches(q: pd.DataFrame) -> pd.DataFrame:
    """One row per execution: instance, size, COMPUTE_START, device start and end, COMPUTE_END, and the earliest
    queue entry of its requests."""
    ok = q[(q["status"] == "ok") & (q["batch_id"] >= 0)]
    g = ok.groupby("batch_id")
    b = pd.DataFrame({"instance": g["instance"].first(), "size": g.size(), "start": g["start_ms"].first(),
                      "device_start": g["device_start_ms"].first(), "device_end": g["device_end_ms"].first(),
                      "compute_end": g["compute_end_ms"].max(), "first_queued": g["admitted_ms"].min()})
    return b.sort_values("start", kind="stable")


def dead_times(b: pd.DataFrame) -> np.ndarray:
    """Per execution, device start less the moment it could have begun: its instance's previous ``COMPUTE_END``
    (none: the run's start) or its first request's ``QUEUE_START``, whichever came later."""
    out = np.empty(len(b))
    prev_end: dict = {}
    for i, r in enumerate(b.itertuples(index=False)):
        ready = max(r.first_queued, prev_end.get(r.instance, -np.inf))
        out[i] = r.device_start - ready
        prev_end[r.instance] = r.compute_end
    return out


def _line(y: np.ndarray, x: np.ndarray) -> tuple[float, float]:
    """Least squares ``y = a + b x`` with ``a, b >= 0`` (a negative slope: the mean, flat)."""
    (a, b), *_ = np.linalg.lstsq(np.column_stack([np.ones_like(x), x]), y, rcond=None)
    if b < 0:
        return max(0.0, float(y.mean())), 0.0
    return max(0.0, float(a)), float(b)


def fit_stack(folders: list[str | Path], name: str = "triton-python-cpu") -> tuple[Any, dict]:
    """The fitted :class:`~dvasim.server.stacks.ServingStack` and the fit's report (in-sample numbers)."""
    from dvasim.server.stacks import ServingStack

    if not folders:
        raise ConfigError("fit", "give at least one dvasim triton folder")
    entries, sizes, exits, exit_sizes, paths, versions, cpus = [], [], [], [], [], set(), set()
    for f in folders:
        q, s = load(f)
        versions.add(str(s.get("triton_version")))
        cpus.add(int((s.get("machine") or {}).get("cpus") or os.cpu_count() or 1))
        b = batches(q)
        if s.get("policy") == "zerobatch":
            entries.append(dead_times(b))
            sizes.append(b["size"].to_numpy())
        exits.append((b["compute_end"] - b["device_end"]).to_numpy())
        exit_sizes.append(b["size"].to_numpy())
        ok = q[q["status"] == "ok"]
        paths.append(((ok["admitted_ms"] - ok["arrival_ms"]) + (ok["finish_ms"] - ok["compute_end_ms"])).to_numpy())
    if not entries:
        raise ConfigError("fit", "no ZeroBatch run among the folders: the entry is fitted on ZeroBatch runs (a "
                                 "delay holds batches back on purpose)")
    entry, size = np.concatenate(entries), np.concatenate(sizes).astype(float)
    if len(entry) < 2:
        raise ConfigError("fit", "too few executions to fit (need at least 2)")
    a, per_row = _line(entry, size)
    exit_all = np.concatenate(exits)
    exit_ms, exit_per_row = _line(exit_all, np.concatenate(exit_sizes).astype(float))
    path = np.clip(np.concatenate(paths), 0.0, None)
    quant = tuple(float(x) for x in np.quantile(path, np.linspace(0.0, 1.0, LEVELS)))
    names = ", ".join(str(Path(f)) for f in folders)
    src = f"measured: dvasim fit on the real Triton server's runs ({names})"
    stack = ServingStack(
        name, f"Triton {'/'.join(sorted(versions))}'s Python backend on a CPU behind gRPC (dvasim's triton engine: "
              "one stub process per instance, the device emulated): host costs fitted to real runs",
        request_ms=a, request_per_row_ms=per_row + exit_per_row, gather_per_row_ms=0.0, sync_ms=exit_ms,
        idle_between_batches=True, modules="eager", launch_fixed_ms=0.0, launch_per_op_ms=0.0,
        launch_per_row_ms=0.0, python_ms=0.0, host_cores=float(max(cpus)), interpreter_lock=False,
        corun_per_worker=0.0, triton_release="24.10", eager_batching=False, client_path_ms=quant,
        sources={
            "request_ms": f"{src}: least squares of device start - max(the instance's previous COMPUTE_END, the "
                          f"first request's QUEUE_START) on the batch size ({len(entry)} ZeroBatch executions), "
                          "intercept",
            "request_per_row_ms": f"{src}: that fit's slope ({per_row:.5f}) + the exit's slope ({exit_per_row:.5f})",
            "sync_ms": f"{src}: least squares of device end -> COMPUTE_END on the batch size ({len(exit_all)} "
                       "executions), intercept",
            "client_path_ms": f"{src}: (QUEUE_START - arrival) + (answer - COMPUTE_END), {len(path)} queries, "
                              f"{LEVELS} quantiles",
            "idle_between_batches": "published: the Python backend's instance thread waits for its stub's execute() "
                                    "and sends the answers before it takes the next payload (python_backend r24.10 "
                                    "src/python_be.cc:1338-1345, 1514-1517; core backend_model_instance.cc:796-805)",
            "triton_release": "measured: the server reports version 2.51.0 (/v2), which is the r24.10 release "
                              "(dvasim/policies/triton_release.py)",
            "modules": "by definition: the model is Python code; no launch cost is modelled (launch_* 0)",
            "launch_fixed_ms": "by definition: in request_ms (the entry is timed whole)",
            "launch_per_op_ms": "by definition: in request_ms (the entry is timed whole)",
            "launch_per_row_ms": "by definition: in request_per_row_ms",
            "python_ms": "by definition: in request_ms (each instance is its own process: no shared lock)",
            "interpreter_lock": "measured: one stub process per instance (ps), each with its own interpreter",
            "host_cores": "measured: os.cpu_count() of the machine the runs were made on",
            "gather_per_row_ms": "by definition: in request_per_row_ms",
            "gather_gbps": "by definition: in request_per_row_ms", "h2d_gbps": "by definition: no device copy",
            "d2h_gbps": "by definition: no device copy", "pinned": "by definition: no device copy",
            "corun_per_worker": "by definition: the emulated device shares itself by the fluid rule alone",
            "eager_batching": "by definition: a TensorRT option",
        })
    report = {"folders": [str(f) for f in folders], "n_executions": int(len(entry)), "n_queries": int(len(path)),
              "entry_ms": [a, float(per_row)], "entry_rmse_ms": float(np.sqrt(np.mean(
                  (entry - a - per_row * size) ** 2))), "exit_ms_mean": float(exit_all.mean()), "exit_ms": [exit_ms, exit_per_row],
              "client_path_ms": {"p50": float(np.median(path)), "p99": float(np.quantile(path, 0.99)),
                                 "mean": float(path.mean())}}
    return stack, report


def write_stack(stack, report: dict, out: str | Path) -> Path:
    from dvasim.outputs import write_text
    from dvasim.server.stacks import stack_to_toml

    header = (f"A serving stack fitted by dvasim fit to {len(report['folders'])} real Triton runs; "
              f"{report['n_executions']} executions, {report['n_queries']} queries.\n"
              f"dvasim run CONFIG --stack {Path(out).name} predicts that server. Every field is pinned.")
    return write_text(out, stack_to_toml(stack, header))
