"""The emulated device (dvasim/engines/triton/device.py) against its table and dvasim's sharing rules.

The device is started as the triton engine starts it (its own process, a Unix socket); clients send executions of
known standalone time and demand. A job never ends before the rule says (the lower bound is exact: the device
measures progress with the monotonic clock), and ends within a wake-up's latency after (the upper bound is loose:
this machine is shared)."""

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

import dvasim.engines.triton.device as devmod
from dvasim.engines.triton.device import Device, Job

SLACK_MS = 40.0  # a wake-up on a loaded 2-core machine; the exact checks are the lower bounds


@pytest.fixture
def device(tmp_path):
    def start(mode="fluid", slowdown=1.0):
        sock = Path(f"/tmp/dvasim-test-{time.monotonic_ns()}.sock")
        log = tmp_path / "device.csv"
        p = subprocess.Popen([sys.executable, devmod.__file__, str(sock), mode, repr(slowdown), str(log)],
                             stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ready"
        procs.append((p, sock))
        return sock, log

    procs = []
    yield start
    for p, sock in procs:
        p.terminate()
        p.wait(5)
        sock.unlink(missing_ok=True)


def run_jobs(sock, jobs):
    """``jobs``: (delay_ms, work_ms, demand) each sent from its own connection after its delay; returns each job's
    (sent_ns, start_ns, end_ns) as the device answered."""
    out = [None] * len(jobs)
    t0 = time.monotonic_ns()

    def one(i, delay, work, demand):
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.connect(str(sock))
        time.sleep(max(0.0, (t0 + delay * 1e6 - time.monotonic_ns()) / 1e9))
        sent = time.monotonic_ns()
        c.sendall(f"start q{i} {work!r} {demand!r}\n".encode())
        start, end = c.makefile("rb").readline().split()
        out[i] = (sent, int(start), int(end))
        c.close()

    threads = [threading.Thread(target=one, args=(i, *j)) for i, j in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_one_execution_takes_its_table_time(device):
    sock, log = device()
    (sent, start, end), = run_jobs(sock, [(0, 30.0, 1.0)])
    took = (end - start) / 1e6
    assert 30.0 - 0.01 <= took <= 30.0 + SLACK_MS
    rec = pd.read_csv(log)
    assert len(rec) == 1 and rec["work_ms"].iloc[0] == 30.0
    assert rec["end_ns"].iloc[0] >= rec["due_ns"].iloc[0]  # the timing error the engine reports is >= 0


def test_fluid_sharing_of_two_saturated_executions(device):
    """Two executions of demand 1 started together each progress at 1/2: both end after 2 x 20 ms."""
    sock, _ = device("fluid")
    res = run_jobs(sock, [(0, 20.0, 1.0), (0, 20.0, 1.0)])
    first_start = min(s for _, s, _ in res)
    for _, _, end in res:
        assert (end - first_start) / 1e6 >= 40.0 - 1.0  # at most the second's start gap earlier
    assert max((e - s) / 1e6 for _, s, e in res) <= 40.0 + SLACK_MS


def test_fluid_small_demands_run_at_full_speed(device):
    """Demands 0.3 + 0.3 <= 1: no slow-down, each takes its own 20 ms (paper Figure 5's preferred sizes)."""
    sock, _ = device("fluid")
    res = run_jobs(sock, [(0, 20.0, 0.3), (0, 20.0, 0.3)])
    for _, s, e in res:
        assert 20.0 - 0.01 <= (e - s) / 1e6 <= 20.0 + SLACK_MS


def test_exclusive_serialises_in_order(device):
    sock, _ = device("exclusive")
    res = run_jobs(sock, [(0, 20.0, 0.1), (5, 20.0, 0.1)])
    (_, s0, e0), (_, s1, e1) = res
    assert s1 >= e0  # the second starts only when the first ended
    assert (e1 - s1) / 1e6 >= 20.0 - 0.01


def test_rule_matches_the_simulators_fluid_arithmetic():
    """The device's rates (no clock involved), worked by hand from the fluid rule of dvasim.engines.sim.device's
    docstring: three jobs of demand 0.5 (total 1.5 > 1) progress at 1/1.5 each; corun_slowdown 1.25 divides the
    rate while two or more run (1/1.25 = 0.8), and not while one runs alone."""
    dev = Device("fluid", 1.0)
    for i in range(3):
        dev.add(Job(None, f"q{i}", 10e6, 0.5, 0), 0)
    assert dev.rates() == pytest.approx([1 / 1.5] * 3)
    slow = Device("parallel", 1.25)
    slow.add(Job(None, "a", 10e6, 1.0, 0), 0)
    assert slow.rates() == [1.0]
    slow.add(Job(None, "b", 10e6, 1.0, 0), 0)
    assert slow.rates() == pytest.approx([0.8, 0.8])
