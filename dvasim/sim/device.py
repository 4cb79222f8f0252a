"""How stage executions that overlap in time share one GPU.

Modes (``[engine] sharing``):

* ``"fluid"`` (default): each execution has its standalone time ``T(b)`` (from the latency table) and a *demand*
  ``d = min(1, thr(b) / thr_max)``, the share of the device it needs, where ``thr(b) = b / T(b)`` and ``thr_max``
  is the stage's best throughput over the profiled batch sizes. While the running executions demand at most 1 in
  total, each runs at its standalone speed; beyond that each progresses at rate ``1 / sum(d)`` (fluid processor
  sharing, re-evaluated at every start and finish). A stage whose throughput is saturated at its batch size has
  demand 1 and so shares the device fairly with anything else; a small batch of a stage that keeps gaining from
  larger batches leaves room for others. This gives the preferred batch sizes of the paper their meaning.
* ``"exclusive"``: one execution at a time, in the order they were launched (a GPU that serialises kernels).
* ``"parallel"``: no interference at all (an upper bound on the benefit of overlap).
* ``"cores"``: a multi-core CPU running each execution on one thread: every execution needs a whole core
  whatever its batch size; with ``n`` running on ``cores`` cores each progresses at ``min(1, cores / n)``. This is
  the model that fits co-run measurements on this machine's CPU best (traces/cpu/sharing.json: mean error 0.21
  with ``corun_slowdown = 1.18``, against 0.50 for the fluid model). The launch overhead
  (``[engine] launch_overhead_ms``: hand-off, book-keeping, buffer copies) is host CPU work, so in this mode it
  is done on the cores too, before the stage's own work, and shares them like it.

In every mode, ``corun_slowdown >= 1`` divides the rate of every execution while two or more run at once: the
interference that a fluid model misses (shared caches and memory bandwidth, or on a CPU the threads' contention),
measured by :mod:`dvasim.calibration.sharing`.
"""

from __future__ import annotations

import math

import simpy

from dvasim.policies.base import time_eps

MODES = ("fluid", "exclusive", "parallel", "cores")


class _Job:
    __slots__ = ("remaining", "demand", "event", "work")

    def __init__(self, work: float, demand: float, event: simpy.Event):
        self.work = work
        self.remaining = work
        self.demand = demand
        self.event = event


class Device:
    def __init__(self, env: simpy.Environment, mode: str = "fluid", corun_slowdown: float = 1.0, cores: int = 2):
        if mode not in MODES:
            raise ValueError(f"sharing mode must be one of {MODES}, got {mode!r}")
        if corun_slowdown < 1.0:
            raise ValueError("corun_slowdown must be >= 1")
        if cores < 1:
            raise ValueError("cores must be >= 1")
        self.env = env
        self.mode = mode
        # a CPU runs the host's launch work (hand-off, book-keeping, copies) on the same cores as the stages
        self.hosts_launch_work = mode == "cores"
        self.cores = cores
        self.slowdown = corun_slowdown
        self.jobs: list[_Job] = []
        self._last = 0.0
        self._gen = 0
        self.busy_time = 0.0  # time with at least one execution running

    def run(self, work_ms: float, demand: float = 1.0) -> simpy.Event:
        """Start an execution of standalone length ``work_ms``; the event fires when it is done."""
        ev = self.env.event()
        self._advance()
        self.jobs.append(_Job(float(work_ms), min(1.0, max(float(demand), 1e-12)), ev))
        self._reschedule()
        return ev

    # ------------------------------------------------------------------
    def _rates(self) -> list[float]:
        n = len(self.jobs)
        if n == 0:
            return []
        if n == 1:
            return [1.0]
        slow = self.slowdown if n >= 2 else 1.0
        if self.mode == "exclusive":
            return [1.0 / slow if k == 0 else 0.0 for k in range(n)]
        if self.mode == "parallel":
            return [1.0 / slow] * n
        if self.mode == "cores":
            return [min(1.0, self.cores / n) / slow] * n
        total = sum(j.demand for j in self.jobs)
        r = (1.0 if total <= 1.0 + 1e-12 else 1.0 / total) / slow
        return [r] * n

    def _advance(self) -> None:
        now = self.env.now
        dt = now - self._last
        if dt > 0 and self.jobs:
            for job, r in zip(self.jobs, self._rates()):
                job.remaining -= dt * r
            self.busy_time += dt
        self._last = now

    def _tolerance(self, job: _Job, rate: float) -> float:
        """Remaining work that counts as done: 1e-9 of the job, or what the clock cannot resolve at this time
        (:func:`time_eps`, times the job's rate), so a timer always advances the clock."""
        return max(1e-9 * max(1.0, job.work), rate * time_eps(self.env.now))

    def _reschedule(self) -> None:
        # finish every job that is done (to rounding), then arm a timer for the next finish
        while True:
            jobs = self.jobs
            rates = self._rates()
            done = [k for k, (j, r) in enumerate(zip(jobs, rates)) if j.remaining <= self._tolerance(j, r)]
            if not done:
                break
            self.jobs = [j for k, j in enumerate(jobs) if k not in done]
            for k in done:
                jobs[k].event.succeed()
        self._gen += 1
        if not jobs:
            return
        nxt = min((j.remaining / r for j, r in zip(jobs, rates) if r > 0), default=math.inf)
        gen = self._gen
        timer = self.env.timeout(max(nxt, 0.0))
        timer.callbacks.append(lambda _ev: self._on_timer(gen))

    def _on_timer(self, gen: int) -> None:
        if gen != self._gen:
            return  # superseded by a later start or finish
        self._advance()
        for j, r in zip(self.jobs, self._rates()):
            if r > 0 and j.remaining / r <= max(1e-9 * max(1.0, j.work), time_eps(self.env.now)):
                j.remaining = 0.0
        self._reschedule()
