"""The triton engine on the real Triton server (tritonserver 2.51.0, r24.10, from .venv/triton): its records,
hand-worked cases whose answer Triton's documented rules fix (a window forming one batch of exactly five is in
test_release_rules.py), and the ways a run refuses or fails.

Each case starts and stops its own server (about 4 s each on the 2-core VM). Cases are built so that the answer
does not depend on this machine's speed: the table's 100 ms executions dwarf every host cost."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dvasim.engines.triton.engine import WARMUP, serve
from tests.engines.triton.conftest import table_csv

DVASIM = [sys.executable, "-m", "dvasim"]
ZB = 'name = "zerobatch"\nmax_batch_size = 8'


def config(tmp_path, policy, workload, latency=lambda b: 100.0, qos_ms=1000.0):
    return {"model": {"table": table_csv(tmp_path / "table.csv", latency)}, "policy": policy,
            "workload": workload, "qos": {"target_ms": qos_ms}}


def pbtxt(tmp_path, text, name="config.pbtxt"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_records_of_a_poisson_run(tmp_path, triton_env):
    """300 Poisson queries under ZeroBatch: every query served and recorded in order of its way through the
    server, every execution's batch accounted for, the server's own statistics agreeing."""
    cfg = config(tmp_path, {"name": "zerobatch", "max_batch_size": 8},
                 {"kind": "poisson", "rate_qps": 300.0, "n_queries": 300, "seed": 2}, latency=lambda b: 2 + 0.5 * b)
    r = serve(cfg, work_dir=tmp_path / "run", env=triton_env)
    q, s, ex = r.queries, r.summary, r.extra["executions"]
    assert len(q) == 300 and (q["status"] == "ok").all() and s["n_completed"] == 300
    chain = ["arrival_ms", "sent_ms", "seen_ms", "admitted_ms", "start_ms", "exec_start_ms", "device_start_ms",
             "device_end_ms", "exec_end_ms", "finish_ms"]
    tol = 1e-3  # the trace and the model log round to the same clock's ns
    for a, b in zip(chain, chain[1:]):
        assert (q[b] - q[a] >= -tol).all(), f"{a} after {b}"
    assert (q["stage0_finish_ms"] == q["exec_end_ms"]).all() and (q["compute_end_ms"] >= q["exec_end_ms"]).all()
    assert ex["batch_size"].sum() == 300 and ex["batch_size"].max() <= 8
    assert (q.groupby("batch_id")["exit_batch_size"].first().to_numpy() ==
            q.groupby("batch_id").size().to_numpy()).all()
    # each execution ran its table time on the device (never less)
    dev = (ex["device_end_ns"] - ex["device_start_ns"]) / 1e6
    assert (dev >= ex["work_ms"] - 0.01).all()
    stats = r.extra["statistics"]["model_stats"][0]
    assert int(stats["inference_count"]) == 300 + WARMUP
    assert int(stats["execution_count"]) == len(ex) + WARMUP
    assert s["engine"] == "triton" and s["triton_version"] == "2.51.0" and "client_behind" in s
    assert s["device_error_ms_mean"] >= 0


def test_max_queue_size_rejects_beyond_the_queue(tmp_path, triton_env):
    """max_batch_size 1, max_queue_size 2, executions of 100 ms, six requests 10 ms apart: the first executes,
    the next two queue, the last three find the queue full (a queue policy turns the prefetch off: core
    scheduler_utils.cc:361-376 at r24.10)."""
    p = pbtxt(tmp_path, "max_batch_size: 1\ndynamic_batching { default_queue_policy { max_queue_size: 2 } }\n")
    cfg = config(tmp_path, {"triton_config": p}, {"kind": "explicit", "arrivals_ms": [0, 10, 20, 30, 40, 50]})
    r = serve(cfg, work_dir=tmp_path / "run", env=triton_env)
    assert r.queries["status"].tolist() == ["ok"] * 3 + ["rejected"] * 3
    assert r.summary["n_rejected"] == 3 and np.isnan(r.queries["finish_ms"].iloc[3:]).all()


def test_priority_levels_serve_the_higher_level_first(tmp_path, triton_env):
    """Two levels, max_batch_size 1, 100 ms executions: while the first request executes, requests of levels
    1, 2, 2, 1 queue; the level-1 ones go first, each level in arrival order."""
    p = pbtxt(tmp_path, "max_batch_size: 1\ndynamic_batching { priority_levels: 2 default_priority_level: 2 }\n")
    cfg = config(tmp_path, {"triton_config": p}, {"kind": "explicit", "arrivals_ms": [0, 10, 20, 30, 40],
                                                  "priority_mix": [0.5, 0.5], "seed": 3})
    q = serve(cfg, work_dir=tmp_path / "run", env=triton_env).queries
    levels = q["priority"].tolist()
    assert levels == [1, 1, 2, 2, 1]  # the seeded draw this case is built on
    order = q.iloc[1:].sort_values("start_ms")["qid"].tolist()
    assert order == [1, 4, 2, 3]


def run_cli(args, env=None, **kw):
    return subprocess.run([*DVASIM, "triton", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})}, **kw)


def write_toml(tmp_path, policy_lines, n=50, rate=100.0, name="c"):
    table_csv(tmp_path / "table.csv", lambda b: 2 + 0.5 * b)
    p = tmp_path / f"{name}.toml"
    p.write_text(f'[model]\ntable = "table.csv"\n[policy]\n{policy_lines}\n[workload]\nkind = "poisson"\n'
                 f'rate_qps = {rate}\nn_queries = {n}\nseed = 1\n[qos]\ntarget_ms = 100.0\n')
    return str(p)


def test_cli_refuses_what_it_cannot_serve_in_one_line(tmp_path, triton_env):
    ens = pbtxt(tmp_path, 'platform: "ensemble" max_batch_size: 8\n', "ens.pbtxt")
    cases = [
        (write_toml(tmp_path, f'triton_config = "{ens}"', name="ens"), [], None, "policy.triton_config"),
        (write_toml(tmp_path, 'name = "dvabatch"', name="dva"), [], None, "policy.name"),
        (write_toml(tmp_path, 'name = "zerobatch"\nmax_batch_size = 16', name="big"), [], None,
         "policy.max_batch_size"),
        (write_toml(tmp_path, ZB, name="zb"), [], {"DVASIM_TRITON_ENV": str(tmp_path / "none")}, "make triton-env"),
    ]
    for cfg, extra, env, needle in cases:
        res = run_cli([cfg, "--out", str(tmp_path / "o"), *extra], env=env)
        assert res.returncode == 2, res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], res.stderr


def test_cli_port_in_use_is_one_line(tmp_path, triton_env):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        res = run_cli([write_toml(tmp_path, ZB), "--out", str(tmp_path / "o"), "--grpc-port",
                       str(port)])
    assert res.returncode == 2 and "grpc_port" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def _server_pids(work: Path) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(work) in cmd and ("tritonserver" in cmd or "device.py" in cmd):
                out.append(int(p.name))
    return out


def _start_long_run(tmp_path):
    cfg = write_toml(tmp_path, ZB, n=1000, rate=200.0)
    out = tmp_path / "o"
    proc = subprocess.Popen([*DVASIM, "triton", cfg, "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (out / "server" / "plan.json").exists():
        time.sleep(0.2)
    time.sleep(1.5)  # the client is sending
    return proc, out


def test_a_server_that_dies_mid_run_is_one_line_and_keeps_the_records(tmp_path, triton_env):
    proc, out = _start_long_run(tmp_path)
    pids = [p for p in _server_pids(out) if b"tritonserver" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert pids
    for p in pids:
        os.kill(p, signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and len(err.strip().splitlines()) == 1 and "server stopped" in err, err
    q = pd.read_parquet(out / "queries.parquet")
    assert len(q) == 1000 and (q["status"] == "ok").sum() > 0 and (q["status"] != "ok").sum() > 0
    assert not _server_pids(out)


@pytest.mark.slow  # make test-slow (a 7 s server run); the default suite kills a server mid-run instead
def test_ctrl_c_stops_the_server_and_leaves_nothing_running(tmp_path, triton_env):
    proc, out = _start_long_run(tmp_path)
    assert _server_pids(out)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    time.sleep(0.5)
    assert not _server_pids(out)
