"""The ``triton`` engine: a dvasim config served on the real Triton server, recorded as the other engines record.

One run (:func:`serve`):

1. the config resolved and checked as :func:`dvasim.api.run` resolves it (the same model table, policy and
   workload: :func:`dvasim.engines.common.workload_for_table`), then what this engine adds: one stage, one
   replica, a device-sharing rule it can emulate, a policy Triton runs;
2. the model repository written (:mod:`dvasim.engines.triton.repository`): dvasim's ``config.pbtxt`` and a Python
   model that runs the table on the emulated device (:mod:`dvasim.engines.triton.device`, started first);
3. the server started (:mod:`dvasim.engines.triton.server`), the workload's queries sent by the seeded client
   (:mod:`dvasim.engines.triton.client`, in the Triton environment's Python, on its own core where the machine has
   one to spare), the server's statistics read, the server stopped (it then writes its trace);
4. the records joined: per query the client's times, Triton's trace (``REQUEST_START``, ``QUEUE_START``,
   ``COMPUTE_START``, ``COMPUTE_END``, ``REQUEST_END``) and the execution that carried it (the model's log, with the
   device's start and end); per execution its batch; a statistics snapshot; what else ran on the machine.

The records are dvasim's (:mod:`dvasim.reporting.records`): ``arrival_ms`` (the workload's arrival; closed loop:
when the client decided to send), ``seen_ms`` (the server's ``REQUEST_START``), ``admitted_ms`` (``QUEUE_START``,
in the batcher's queue), ``start_ms`` / ``stage0_start_ms`` (``COMPUTE_START``: the instance took its batch),
``stage0_finish_ms`` (the Python model's ``execute`` returned its answers), ``finish_ms`` (the answer at the
client), with ``exit_batch_size`` the
batch's size and ``status`` ok, rejected, timed_out or unfinished (never answered: ``message`` says why); and this engine's own columns: ``sent_ms`` (the client's
send; ``client_lag_ms = sent - arrival``), ``device_start_ms`` / ``device_end_ms``, ``exec_start_ms`` /
``exec_end_ms`` (the Python model's ``execute``), ``compute_end_ms`` (``COMPUTE_END``: Triton stamps it after
the backend let go of the batch, which may be after the answers reached the client), ``request_end_ms``
(``REQUEST_END``), ``instance``. Times are ms
from the client's time zero, on one clock (``CLOCK_MONOTONIC``: Triton's trace, the client and the device).

A run whose client fell behind its arrivals is marked so (``client_behind``: the 99th percentile of
``client_lag_ms`` above :data:`CLIENT_BEHIND_MS`). A server that dies during the run stops it with one line
(:class:`~dvasim.engines.triton.server.TritonUnavailable`), the records collected so far written.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dvasim.engines.triton.repository import (
    MODEL_NAME,
    emulation,
    pbtxt_from_file,
    pbtxt_from_policy,
    write_repository,
)
from dvasim.engines.triton.server import (
    RELEASE,
    TritonEnv,
    TritonServer,
    TritonUnavailable,
    check_stub,
    find_env,
)
from dvasim.errors import ConfigError

HERE = Path(__file__).resolve().parent
CLIENT_BEHIND_MS = 2.0  # a client whose p99 send lag exceeds this did not keep the workload's times
DEVICE_MODES = ("fluid", "exclusive", "parallel")
WARMUP = 5  # untimed requests before the run (the first ones pay the stub's and the server's first-call costs)
TRACE_KEYS = ("REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_END", "REQUEST_END")


@dataclass
class TritonSetup:
    """A checked config and what the engine serves it with."""

    cfg: dict
    table: Any
    policy: Any
    workload: Any
    pbtxt: str
    emu: dict
    instances: int


def check_triton_config(config, overrides: list[str] | None = None) -> TritonSetup:
    """Resolve and check ``config`` for the triton engine, before anything starts: a
    :class:`~dvasim.errors.DvasimError` naming the field otherwise."""
    from dvasim import config as cfgmod
    from dvasim.engines.common import check_one_replica, policy_from_section, workload_for_table
    from dvasim.model.catalog import resolve_model

    cfg = cfgmod.resolve(config, overrides)
    check_one_replica(cfg["cluster"], "the triton engine")
    eng = cfg["engine"]
    if eng.get("sharing", "fluid") not in DEVICE_MODES:
        raise ConfigError("engine.sharing", f"{eng['sharing']!r}: the emulated device shares itself by "
                                            f"{', '.join(DEVICE_MODES)}; choose one of those")
    if eng.get("contention", "none") not in (None, "none"):
        raise ConfigError("engine.contention", "the emulated device has no contention model; remove it")
    table = resolve_model(cfg["model"]).table
    policy = policy_from_section(cfg["policy"])
    workload = workload_for_table(cfg, table)
    pol = {**cfg["policy"], **policy.describe()}
    instances = int(eng["instances"])
    text = (pbtxt_from_file(cfg["policy"]["triton_config"]) if cfg["policy"].get("triton_config")
            else pbtxt_from_policy(pol, instances))
    mbs = int(pol.get("max_batch_size", 64))
    if mbs > table.max_batch_size:
        raise ConfigError("policy.max_batch_size", f"{mbs} is beyond the table's largest batch "
                                                   f"({table.max_batch_size}); the device could not time it")
    lengths = None if table.seq_lens is None else [int(x) for x in np.unique(workload.seq_lens)]
    emu = emulation(table, mbs, lengths)
    return TritonSetup(cfg, table, policy, workload, text, emu, instances)


def _plan(setup: TritonSetup, url: str) -> dict[str, Any]:
    w = setup.workload
    plan: dict[str, Any] = {"url": url, "model": MODEL_NAME, "n_queries": int(len(w.seq_lens)),
                            "seq_lens": [int(x) for x in w.seq_lens],
                            "priorities": None if w.priorities is None else [int(x) for x in w.priorities],
                            "deadline_s": 30.0, "warmup": WARMUP}
    if w.closed_clients:
        plan["closed"] = {"clients": int(w.closed_clients), "think_ms": float(w.think_ms)}
    else:
        plan["arrivals_ms"] = [float(x) for x in w.arrivals_ms]
    return plan


def _machine_load() -> dict[str, Any]:
    """What else ran: the load average, and the CPU seconds of every other process (from /proc)."""
    out: dict[str, Any] = {}
    with contextlib.suppress(OSError):
        out["loadavg"] = [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    return out


def _processes() -> dict[int, tuple[int, float]]:
    """Every process now: its parent's pid and the CPU seconds it has used (from /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (p / "stat").read_text()
            f = stat[stat.rindex(")") + 2:].split()
            out[int(p.name)] = (int(f[1]), (int(f[11]) + int(f[12])) / tick)
    return out


def _others_cpu_s(before: dict, after: dict, root: int) -> float:
    """CPU seconds that processes other than ``root`` and its descendants (the run's own: the server, its stubs,
    the device, the client) used between the two snapshots of :func:`_processes`."""
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in after.items():
        kids.setdefault(ppid, []).append(pid)
    ours, todo = set(), [root]
    while todo:
        q = todo.pop()
        ours.add(q)
        todo.extend(kids.get(q, []))
    return sum(cpu - before.get(pid, (0, 0.0))[1] for pid, (_, cpu) in after.items() if pid not in ours)


def _pin(cmd: list[str], cores: str | None) -> list[str]:
    """``cmd`` kept to ``cores`` (taskset's list), or as it is."""
    return ["taskset", "-c", cores, *cmd] if cores is not None else cmd


def serve(config, overrides: list[str] | None = None, *, work_dir: str | Path, env: TritonEnv | None = None,
          ports: dict[str, int] | None = None, pin: bool = True):
    """Serve ``config`` on the real Triton server; returns a :class:`dvasim.api.RunResult` (its ``extra`` holds
    the executions, the statistics and the folder). ``work_dir`` keeps the model repository, the server's log and
    trace, the client's and the model's raw records. ``pin``: on a machine of two or more cores the client runs
    on the last core and the server, its stubs and the device on the others."""
    setup = check_triton_config(config, overrides)
    env = env or find_env()
    check_stub(env)
    work = Path(work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    logs = work / "model_logs"
    logs.mkdir(exist_ok=True)
    for old in logs.glob("*.csv"):
        old.unlink()
    ncpu = os.cpu_count() or 1
    client_core = ncpu - 1 if pin and ncpu >= 2 and _has_taskset() else None
    server_cores = None if client_core is None else f"0-{ncpu - 2}" if ncpu > 2 else "0"
    sock = Path(f"/tmp/dvasim-device-{os.getpid()}-{int(time.time() * 1e6) % 10**9}.sock")
    device_log = work / "device.csv"
    dev_cmd = _pin([str(env.python), str(HERE / "device.py"), str(sock), setup.cfg["engine"].get("sharing", "fluid"),
                    repr(float(setup.cfg["engine"].get("corun_slowdown", 1.0))), str(device_log)], server_cores)
    device = subprocess.Popen(dev_cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
    server = None
    before = _processes()
    load_before = _machine_load()
    t_run = time.monotonic()
    try:
        if device.stdout is None or device.stdout.readline().strip() != "ready":
            raise TritonUnavailable("triton", "the emulated device did not start (python: " f"{env.python})")
        repo = write_repository(work / "repository", setup.pbtxt, setup.emu, env.site, sock, logs)
        server = TritonServer(env, repo, work, server_cores=server_cores).start(ports)
        version = server.version()
        plan = _plan(setup, server.grpc)
        plan_path, client_csv = work / "plan.json", work / "client.csv"
        plan_path.write_text(json.dumps(plan), encoding="utf-8")
        client = subprocess.run(_pin([str(env.python), str(HERE / "client.py"), str(plan_path), str(client_csv)],
                                     None if client_core is None else str(client_core)), capture_output=True, text=True)
        after = _processes()
        died = not server.alive()
        stats = {} if died else server.statistics(MODEL_NAME)
        status = server.stop()
        if client.returncode != 0 and not client_csv.exists():
            raise TritonUnavailable("triton", f"the client failed: {client.stderr.strip().splitlines()[-1:]}")
    finally:
        if server is not None:
            server.stop()
        with contextlib.suppress(OSError):
            if device.poll() is None:
                device.terminate()
                device.wait(5)
        with contextlib.suppress(OSError):
            sock.unlink()
    wall = time.monotonic() - t_run
    machine = {"load_before": load_before, "load_after": _machine_load(),
               "others_cpu_s": round(_others_cpu_s(before, after, os.getpid()), 3), "cpus": ncpu,
               "client_core": client_core, "server_cores": server_cores}
    result = records(setup, work, stats, version=version, machine=machine, wall_s=wall)
    if died:
        result.summary["server_died"] = True
        raise ServerDied(f"the server stopped during the run (exit status {status}; log {server.log_path})",
                         result)
    return result


class ServerDied(TritonUnavailable):
    """The server died during a run: :attr:`result` holds the records collected until then."""

    def __init__(self, message: str, result):
        super().__init__("triton", message)
        self.result = result


def _has_taskset() -> bool:
    from shutil import which

    return which("taskset") is not None


def read_trace(path: Path) -> pd.DataFrame:
    """Triton's trace file (one JSON list of trace events) as one row per request id: its timestamps (ns)."""
    if not path.exists():
        return pd.DataFrame(columns=["qid", *TRACE_KEYS])
    with contextlib.suppress(json.JSONDecodeError):
        events = json.loads(path.read_text(encoding="utf-8"))
        by: dict[int, dict] = {}
        for e in events:
            row = by.setdefault(e["id"], {})
            if "request_id" in e:
                row["qid"] = int(e["request_id"]) if str(e["request_id"]).isdigit() else -1
            for t in e.get("timestamps", ()):
                if t["name"] in TRACE_KEYS:
                    row.setdefault(t["name"], int(t["ns"]))
        rows = [r for r in by.values() if r.get("qid", -1) >= 0]
        return pd.DataFrame(rows, columns=["qid", *TRACE_KEYS])
    return pd.DataFrame(columns=["qid", *TRACE_KEYS])


def read_client(path: Path) -> tuple[int, pd.DataFrame]:
    with open(path, encoding="utf-8") as f:
        t0 = int(f.readline().split(":", 1)[1].strip().strip('"'))
        return t0, pd.read_csv(f, keep_default_na=False, na_values={"arrival_ns": [""], "sent_ns": [""],
                                                                    "done_ns": [""]})


def read_executions(logs: Path) -> pd.DataFrame:
    frames = [pd.read_csv(p, dtype={"requests": str}) for p in sorted(logs.glob("executions_*.csv"))
              if p.stat().st_size > 0]
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame(columns=["instance", "batch_size", "length", "requests", "exec_start_ns",
                                     "device_start_ns", "device_end_ns", "exec_end_ns", "work_ms"])
    ex = pd.concat(frames, ignore_index=True).sort_values("exec_start_ns", kind="stable").reset_index(drop=True)
    timed = ex["requests"].astype(str).map(lambda s: any(x.isdigit() for x in s.split(";")))
    return ex[timed].reset_index(drop=True)  # the warm-up's executions left out


def records(setup: TritonSetup, work: Path, stats: dict, *, version: str, machine: dict, wall_s: float):
    """The run's :class:`~dvasim.reporting.result.RunResult` from the raw files in ``work``."""
    from dvasim.reporting.metrics import summarize
    from dvasim.reporting.result import RunResult

    t0, cl = read_client(work / "client.csv")
    tr = read_trace(work / "trace.json")
    ex = read_executions(work / "model_logs")
    n = len(cl)

    def ms(ns):
        return (np.asarray(ns, dtype=float) - t0) / 1e6

    df = pd.DataFrame({"qid": cl["qid"].to_numpy(dtype=np.int64)})
    df["arrival_ms"] = ms(cl["arrival_ns"])
    df["sent_ms"] = ms(cl["sent_ns"])
    tr = tr.set_index("qid").reindex(df["qid"])
    df["seen_ms"] = ms(tr["REQUEST_START"])
    df["admitted_ms"] = ms(tr["QUEUE_START"])
    status = cl["status"].astype(str).to_numpy()
    ok = status == "ok"
    df["start_ms"] = np.where(ok, ms(tr["COMPUTE_START"]), np.nan)
    df["stage0_start_ms"] = df["start_ms"]
    df["compute_end_ms"] = ms(tr["COMPUTE_END"])
    df["request_end_ms"] = ms(tr["REQUEST_END"])
    df["finish_ms"] = np.where(ok, ms(cl["done_ns"]), np.nan)
    # a query the server never answered (it died, or the client's deadline passed) is "unfinished", its reason
    # in ``message``
    df["status"] = np.where(np.isin(status, ["ok", "rejected", "timed_out"]), status, "unfinished")
    df["message"] = cl["message"].astype(str).to_numpy()
    # the execution that carried each query
    batch = np.full(n, -1, dtype=np.int64)
    size = np.zeros(n, dtype=np.int64)
    cols = {k: np.full(n, np.nan) for k in ("exec_start_ms", "device_start_ms", "device_end_ms", "exec_end_ms")}
    inst = np.array([""] * n, dtype=object)
    for i, e in enumerate(ex.itertuples(index=False)):
        ids = [j for j in (int(x) for x in str(e.requests).split(";") if x.isdigit()) if 0 <= j < n]
        batch[ids] = i
        size[ids] = int(e.batch_size)
        for k in cols:
            cols[k][ids] = (getattr(e, k.replace("_ms", "_ns")) - t0) / 1e6
        inst[ids] = e.instance
    df["stage0_finish_ms"] = np.where(ok, cols["exec_end_ms"], np.nan)  # the model answered its batch
    df["batch_id"] = batch
    df["exit_batch_id"] = batch
    df["exit_batch_size"] = size
    for k, v in cols.items():
        df[k] = v
    df["instance"] = inst
    df["seq_len"] = np.asarray(setup.workload.seq_lens, dtype=np.int64)[:n]
    df["priority"] = (np.asarray(setup.workload.priorities, dtype=np.int64)[:n] if setup.workload.priorities
                      is not None else 0)
    df["client_lag_ms"] = df["sent_ms"] - df["arrival_ms"]
    df["latency_ms"] = df["finish_ms"] - df["arrival_ms"]
    summary = summarize(df, setup.cfg["qos"]["target_ms"])
    lag = df["client_lag_ms"].dropna().to_numpy()
    dev = pd.read_csv(work / "device.csv") if (work / "device.csv").exists() else pd.DataFrame()
    err = ((dev["end_ns"] - dev["due_ns"]) / 1e6).to_numpy() if len(dev) else np.array([])
    span = (np.nanmax(df["finish_ms"]) - np.nanmin(df["arrival_ms"])) if ok.any() else np.nan
    summary.update(
        engine="triton", policy=setup.policy.name, model=setup.table.name, n_stages=1,
        instances=setup.instances, triton_version=version, triton_release=RELEASE,
        stack=f"real Triton {version} (r{RELEASE}), Python backend on this CPU, gRPC client; emulated device",
        n_unanswered=int((df["status"] == "unfinished").sum()), n_executions=int(len(ex)),
        mean_batch_size=float(ex["batch_size"].mean()) if len(ex) else float("nan"),
        client_lag_ms_mean=float(lag.mean()) if len(lag) else float("nan"),
        client_lag_ms_p99=float(np.percentile(lag, 99)) if len(lag) else float("nan"),
        client_behind=bool(len(lag) and np.percentile(lag, 99) > CLIENT_BEHIND_MS),
        device_error_ms_mean=float(err.mean()) if len(err) else float("nan"),
        device_error_ms_p99=float(np.percentile(err, 99)) if len(err) else float("nan"),
        served_qps=float(ok.sum() / span * 1000.0) if span and span > 0 else float("nan"),
        triton_wall_s=round(wall_s, 3), machine=machine,
    )
    resolved = {**setup.cfg, "policy": {**setup.cfg["policy"], **setup.policy.describe()},
                "triton": {"config_pbtxt": setup.pbtxt, "version": version, "release": RELEASE}}
    return RunResult(df, summary, resolved, None, extra={"executions": ex, "statistics": stats, "t0_ns": t0,
                                                        "work_dir": str(work), "device": dev})


def write_extras(result, out_dir: Path) -> None:
    """``executions.csv`` (one row per execution: instance, batch size, requests, ms times), ``stats.json`` (the
    server's statistics at the run's end) and ``config.pbtxt`` (what the server served)."""
    from dvasim.outputs import write_text

    out = Path(out_dir)
    ex = result.extra["executions"].copy()
    t0 = result.extra["t0_ns"]
    for k in ("exec_start", "device_start", "device_end", "exec_end"):
        ex[f"{k}_ms"] = (ex.pop(f"{k}_ns") - t0) / 1e6
    write_text(out / "executions.csv", ex.to_csv(index=False))
    write_text(out / "stats.json", json.dumps(result.extra["statistics"], indent=1))
    write_text(out / "config.pbtxt", result.config["triton"]["config_pbtxt"])
