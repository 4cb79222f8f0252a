"""The emulated device of the ``triton`` engine: one process that every Triton model instance's executions run on.

Triton's Python backend runs each model instance in its own stub process, so the executions of several instances
must meet somewhere to share one device. They meet here: an instance sends ``start`` with its batch's standalone
time ``T(b)`` (from the config's latency table, :mod:`dvasim.model.table`) and its demand ``d`` (the table's
``demand``: ``min(1, thr(b) / thr_max)``), and gets its answer when the execution is done. The device shares
itself among the running executions by the rule of dvasim's device model (:mod:`dvasim.engines.sim.device`,
``[engine] sharing``):

* ``"fluid"``: while the running executions demand at most 1 in total each runs at its standalone speed; beyond
  that each progresses at rate ``1 / sum(d)``, re-evaluated at every start and finish;
* ``"exclusive"``: one at a time, in the order they started;
* ``"parallel"``: no interference.

``corun_slowdown`` divides every rate while two or more run at once, as in the simulator.

The device sleeps (``select(2)``, whose timeout is in microseconds: epoll's and poll's are rounded up to whole
milliseconds, half a millisecond late on average) between events, and spins only the last 0.3 ms before an end
(a sleeping process wakes 0.1-0.2 ms late on a busy core): on a small machine the Triton server, its stubs and the
client need the cores. Every execution's record (``device.csv``) keeps the
time it asked, when it started and ended on the device, and the time the rule says it should have ended given
the events before it (``due``: the end the device slept until): ``end - due`` is the device's own timing error (its wake-up latency), which the
engine reports (``device_error_ms_mean``, ``_p99``).

This file runs on its own in the Triton environment's Python (``python device.py SOCKET MODE SLOWDOWN LOG``):
it imports the standard library only. Times are ``time.monotonic_ns`` (the clock of Triton's trace and of the
client, one clock on one machine).
"""

from __future__ import annotations

import os
import selectors
import socket
import sys
import time

MODES = ("fluid", "exclusive", "parallel")
EPS_NS = 2_000  # an execution within 2 us of its end is done (a wake-up is never more precise than that)
SPIN_NS = 300_000  # the last 0.3 ms before an end are spun, not slept: a sleeping process wakes 0.1-0.2 ms late


class Job:
    __slots__ = ("conn", "req", "work", "demand", "asked", "start", "left")

    def __init__(self, conn, req: str, work_ns: float, demand: float, asked: int):
        self.conn, self.req, self.work, self.demand, self.asked = conn, req, work_ns, demand, asked
        self.start = -1  # on the device since (exclusive: when its turn came)
        self.left = work_ns  # standalone ns of work left


class Device:
    """The sharing rule in real time: ``rates`` gives each running job's progress per ns."""

    def __init__(self, mode: str, slowdown: float):
        if mode not in MODES:
            raise SystemExit(f"device: mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode, self.slowdown = mode, slowdown
        self.running: list[Job] = []
        self.waiting: list[Job] = []  # exclusive: in the order they asked
        self.last = time.monotonic_ns()

    def rates(self) -> list[float]:
        n = len(self.running)
        if n == 0:
            return []
        if self.mode == "fluid":
            total = sum(j.demand for j in self.running)
            base = 1.0 / total if total > 1.0 else 1.0
        else:
            base = 1.0
        if n > 1:
            base /= self.slowdown
        return [base] * n

    def advance(self, now: int) -> None:
        dt = now - self.last
        if dt > 0:
            for j, r in zip(self.running, self.rates()):
                j.left -= dt * r
        self.last = now

    def add(self, job: Job, now: int) -> None:
        self.advance(now)
        if self.mode == "exclusive" and self.running:
            self.waiting.append(job)
            return
        job.start = now
        self.running.append(job)

    def next_end(self) -> int | None:
        """When the first running job ends at the current rates (ns), or None."""
        ends = [self.last + max(0.0, j.left) / r for j, r in zip(self.running, self.rates())]
        return int(min(ends)) if ends else None

    def finish_due(self, now: int) -> list[Job]:
        self.advance(now)
        done = [j for j in self.running if j.left <= EPS_NS]
        if done:
            self.running = [j for j in self.running if j.left > EPS_NS]
            if self.mode == "exclusive" and not self.running and self.waiting:
                nxt = self.waiting.pop(0)
                nxt.start = now
                self.running.append(nxt)
        return done


def serve(path: str, mode: str, slowdown: float, log_path: str) -> None:
    dev = Device(mode, slowdown)
    sel = selectors.SelectSelector()  # select(2) takes its timeout in us; epoll and poll round it up to whole ms
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if os.path.exists(path):
        os.unlink(path)
    srv.bind(path)
    srv.listen(64)
    sel.register(srv, selectors.EVENT_READ, None)
    buffers: dict = {}
    with open(log_path, "w", encoding="utf-8") as log:
        log.write("request,asked_ns,start_ns,end_ns,due_ns,work_ms,demand\n")
        print("ready", flush=True)
        while True:
            nxt = dev.next_end()
            timeout = None if nxt is None else max(0.0, (nxt - SPIN_NS - time.monotonic_ns()) / 1e9)
            for key, _ in sel.select(timeout):
                if key.data is None:
                    conn, _ = srv.accept()
                    sel.register(conn, selectors.EVENT_READ, b"")
                    buffers[conn] = b""
                    continue
                conn = key.fileobj
                chunk = conn.recv(4096)
                if not chunk:  # an instance went away
                    sel.unregister(conn)
                    conn.close()
                    buffers.pop(conn, None)
                    continue
                buffers[conn] += chunk
                while b"\n" in buffers[conn]:
                    line, buffers[conn] = buffers[conn].split(b"\n", 1)
                    word, req, work_ms, demand = line.decode().split()
                    if word == "stop":
                        return
                    now = time.monotonic_ns()
                    dev.add(Job(conn, req, float(work_ms) * 1e6, float(demand), now), now)
            now = time.monotonic_ns()
            if nxt is not None and 0 < nxt - now <= SPIN_NS:  # spin the last stretch (messages wait that long)
                while now < nxt:
                    now = time.monotonic_ns()
            for j in dev.finish_due(now):
                try:
                    j.conn.sendall(f"{j.start} {now}\n".encode())
                except OSError:
                    pass
                due = nxt if nxt is not None else now  # the end the rule gave it when the device went to sleep
                log.write(f"{j.req},{j.asked},{j.start},{now},{due},{j.work / 1e6:.6f},{j.demand:.6f}\n")
            log.flush()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4])
