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

Contention (``[engine] contention``, fluid mode only): ``"none"`` (default) is the model above. ``"overlap"``
makes every running execution claim at least a share ``k`` (``contention_share``) of the device: its demand counts
as ``d' = k + (1 - k) * d``, so with ``n`` running, of total demand ``D``, each progresses at rate
``1 / max(1, D + k * (n - D))``. One execution alone (``d' <= 1``) runs at its standalone speed, as before; small
batches (low ``d``: small kernels, bound by their launch, dispatch and tails rather than by the SMs) contend far
more than the fluid model says, large ones (``d`` near 1) hardly more. Calibrated on an H100's four threads each
replaying one stage's CUDA graph on its own stream (:mod:`dvasim.studies.contention`): ``k = 0.379`` from the
two batch-1 co-runs (overlap 2.2x where the fluid model says 3.7x) predicts the held-out batch-8 one (1.30x against
1.3x measured, fluid 1.59x).

In every mode, ``corun_slowdown >= 1`` divides the rate of every execution while two or more run at once: the
interference that a fluid model misses (shared caches and memory bandwidth, or on a CPU the threads' contention),
measured by :mod:`dvasim.model.profiling.sharing`. A serving stack's ``corun_per_worker = k`` (E2bird's concurrent
workers, :mod:`dvasim.server.stacks`) divides it further by ``1 + k * (n - 1)`` while ``n`` run at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Final

import simpy

from dvasim.config.sections import CONTENTION_MODELS, OVERLAP_SHARE_H100, SHARING_MODES
from dvasim.core.arith import left_sum
from dvasim.core.operations import time_eps

MODES = SHARING_MODES  # declared with the [engine] section (dvasim.config.sections)
# (constants: a compiled core reads them without looking them up in simpy's modules)
_EVENT: Final = simpy.Event
_NORMAL: Final = simpy.events.NORMAL
# the work clock is set back to 0 once past this (ms of work): a job's work left is read from it to the precision of
# a number this size (2**-32 ms), well below a job's tolerance (1e-9 of its work, at least 1e-9 ms)
_CLOCK_LIMIT: Final = 2.0**20


class _Job:
    __slots__ = ("remaining", "end", "demand", "event", "done", "work", "tol")

    def __init__(self, work: float, demand: float, event: simpy.Event | None, done: Callable[[], None] | None):
        self.set(work, demand, event, done)

    def set(self, work: float, demand: float, event: simpy.Event | None, done: Callable[[], None] | None) -> None:
        self.work = work
        self.remaining = work  # exclusive mode: the work it has left (only the first job progresses)
        self.end = 0.0  # the other modes: the work clock's reading when it is done (Device._clock)
        self.demand = demand
        self.event = event  # what finishing succeeds (:meth:`Device.run`), or None
        self.done = done  # what finishing calls (:meth:`Device.start`), or None
        self.tol = 1e-9 * max(1.0, work)  # remaining work that counts as done (at least; see Device._done)


class Device:
    """The device's running executions and the one timer of the next finish.

    Two ways in: :meth:`run` returns an event that fires when the execution is done (a process waits for it),
    and re-plans at once; :meth:`start` calls ``done()`` when it is done (the engine's callbacks: no event between
    the finish and its handler) and re-plans only at :meth:`settle`, so that a handler starting several executions
    arms one timer. The timer is re-armed only when the next finish moves (a superseded one fires as a no-op).

    Every mode but ``exclusive`` runs all its executions at one rate, so one *work clock* (the work each has done
    at that rate since it started) stands for all of them: an execution started at clock ``c`` with work ``w`` is
    done when the clock reaches ``c + w``. A start or finish changes the rate, and with it only how fast the clock
    moves: no execution is re-planned. A start costs the same whatever the number running (it compares itself with
    the execution that finishes first); only a finish looks at every running execution (which are done, the next
    to finish, their total demand). ``exclusive`` runs only the first: it alone has its work counted down."""

    def __init__(self, env: simpy.Environment, mode: str = "fluid", corun_slowdown: float = 1.0, cores: float = 2,
                 corun_per_worker: float = 0.0, contention: str = "none",
                 contention_share: float = OVERLAP_SHARE_H100):
        if mode not in MODES:
            raise ValueError(f"sharing mode must be one of {MODES}, got {mode!r}")
        if contention not in CONTENTION_MODELS:
            raise ValueError(f"contention must be one of {CONTENTION_MODELS}, got {contention!r}")
        if contention == "overlap" and mode != "fluid":
            raise ValueError(f'contention "overlap" applies to the fluid mode only, not {mode!r}')
        if not 0.0 <= contention_share <= 1.0:
            raise ValueError(f"contention_share must be in [0, 1], got {contention_share!r}")
        if corun_slowdown < 1.0:
            raise ValueError("corun_slowdown must be >= 1")
        if cores < 1:
            raise ValueError("cores must be >= 1")
        self.env = env
        self.mode = mode
        self._exclusive = mode == "exclusive"
        # a CPU runs the host's launch work (hand-off, book-keeping, copies) on the same cores as the stages
        self.hosts_launch_work = mode == "cores"
        self.cores = cores
        self.slowdown = corun_slowdown
        if corun_per_worker < 0:
            raise ValueError("corun_per_worker must be >= 0")
        self.per_worker = corun_per_worker  # a co-run penalty growing with the executions running at once
        # the share of the device every running execution claims at least (0: no contention beyond the fluid model)
        self.share: float = float(contention_share) if contention == "overlap" else 0.0
        self.jobs: list[_Job] = []
        self._spare: list[_Job] = []  # finished jobs' records, set again by the next starts (none allocated then)
        self._last = 0.0
        self._r = 1.0  # the rate of the running executions (see _rate), kept as the set of jobs changes
        # the running jobs' demands added left to right (arith.left_sum's rounding): a start adds its own, a finish
        # adds the others' again
        self._demand = 0.0
        self._tol = 0.0  # the largest tolerance of a running job (see _finished_jobs)
        self._clock = 0.0  # the work clock (see the class; not used in exclusive mode)
        # the running job that finishes first (None: not known, searched at the next plan; not used in exclusive
        # mode, where the first job is the one that progresses)
        self._least: _Job | None = None
        self._timer: simpy.Event | None = None  # the armed timer of the next finish (earlier ones are superseded)
        self._timer_at = math.inf  # when it fires
        self._stale = False  # jobs were started since the last plan (:meth:`start`)
        self._planning = False  # inside _reschedule (a done() callback's starts are planned by it)
        self._timer_cb = self._on_timer  # (the bound method every timer calls, made once)
        self.busy_time = 0.0  # time with at least one execution running

    def run(self, work_ms: float, demand: float = 1.0) -> simpy.Event:
        """Start an execution of standalone length ``work_ms``; the event fires when it is done."""
        ev = _EVENT(self.env)
        self._add(self._job(float(work_ms), min(1.0, max(float(demand), 1e-12)), ev, None))
        self._reschedule()
        return ev

    def start(self, work_ms: float, demand: float, done: Callable[[], None]) -> None:
        """Start an execution of standalone length ``work_ms``; ``done()`` is called when it is done. Planned at
        the next :meth:`settle` (or by the finish being handled, when started from a ``done()``)."""
        d = float(demand)
        self._add(self._job(float(work_ms), 1.0 if d >= 1.0 else d if d > 1e-12 else 1e-12, None, done))
        self._stale = True

    def _job(self, work: float, demand: float, event: simpy.Event | None, done: Callable[[], None] | None) -> _Job:
        spare = self._spare
        if not spare:
            return _Job(work, demand, event, done)
        job = spare.pop()
        job.set(work, demand, event, done)
        return job

    def settle(self) -> None:
        """Plan the executions started since the last plan: finish those already done, arm the next timer."""
        if self._stale and not self._planning:
            self._reschedule()

    def _add(self, job: _Job) -> None:
        self._advance()
        if not self.jobs:
            self._clock = 0.0  # (idle: the clock starts again from 0)
        job.end = self._clock + job.work
        least = self._least
        if not self.jobs or least is not None and job.end < least.end:
            self._least = job
        self.jobs.append(job)
        self._demand += job.demand  # (the sum over the jobs before it, plus its own: the same left-to-right sum)
        if job.tol > self._tol:
            self._tol = job.tol
        self._r = self._rate()

    # ------------------------------------------------------------------
    def _rate(self) -> float:
        """The rate of every running execution (of the first one, in exclusive mode; the others' is 0)."""
        jobs = self.jobs
        n = len(jobs)
        if n <= 1:
            return 1.0
        slow = self.slowdown
        if self.per_worker:
            slow *= 1.0 + self.per_worker * (n - 1)
        mode = self.mode
        if mode == "exclusive" or mode == "parallel":
            return 1.0 / slow
        if mode == "cores":
            return min(1.0, self.cores / n) / slow
        total = self._demand
        share = self.share
        if share > 0.0:  # contention "overlap": every demand d counts as share + (1 - share) * d
            total = total + share * (n - total)
        return (1.0 if total <= 1.0 + 1e-12 else 1.0 / total) / slow

    def _advance(self) -> None:
        now = self.env._now  # (the attribute behind Environment.now: read on every start and finish)
        dt = now - self._last
        jobs = self.jobs
        if dt > 0 and jobs:
            step = dt * self._r
            if self._exclusive:
                jobs[0].remaining -= step  # the others run at rate 0
            else:
                clock = self._clock + step
                if clock > _CLOCK_LIMIT:  # set back to 0 (exact: end and clock are within a factor 2 of each other)
                    for job in jobs:
                        job.end -= clock
                    clock = 0.0
                self._clock = clock
            self.busy_time += dt
        self._last = now

    def _finished_jobs(self, te: float) -> list[_Job]:
        """The jobs done to rounding: remaining work below 1e-9 of the job, or below what the clock cannot
        resolve at this time (:func:`time_eps`, times the job's rate), so that a timer always advances the clock."""
        r, jobs = self._r, self.jobs
        if self._exclusive:
            first = jobs[0]
            done = [first] if first.remaining <= max(first.tol, r * te) else []
            return done + [j for j in jobs[1:] if j.remaining <= j.tol]
        rte, clock = r * te, self._clock
        least = self._least
        if least is not None and least.end - clock > (self._tol if self._tol > rte else rte):
            return []  # the least left is beyond every job's tolerance: none is done (no search)
        if len(jobs) == 1:
            j = jobs[0]
            return [j] if j.end - clock <= (j.tol if j.tol > rte else rte) else []
        return [j for j in jobs if j.end - clock <= max(j.tol, rte)]

    def _reschedule(self) -> None:
        # finish every job that is done (to rounding), then arm a timer for the next finish (unless armed there)
        self._planning = True
        try:
            env = self.env
            while True:
                jobs = self.jobs
                if not jobs:
                    break
                done = self._finished_jobs(time_eps(env._now))
                if not done:
                    break
                self.jobs = [j for j in jobs if j not in done] if len(done) < len(jobs) else []
                self._least = None
                self._sum_running()
                self._r = self._rate()
                for j in done:
                    if j.done is None:
                        j.event.succeed()
                    else:
                        j.done()  # may start executions: the loop plans them
                    j.event = j.done = None
                    self._spare.append(j)
        finally:
            self._planning = False
        self._stale = False
        jobs = self.jobs
        if not jobs:
            self._timer, self._timer_at = None, math.inf
            return
        # min(remaining) / r == min(remaining / r): division by one positive number keeps the order
        if self._exclusive:
            least = jobs[0].remaining
        else:
            first = self._least
            if first is None:  # a job finished since the last plan: search the running ones
                first = jobs[0]
                for j in jobs:
                    if j.end < first.end:
                        first = j
                self._least = first
            least = first.end - self._clock
        nxt = least / self._r
        env = self.env
        delay = nxt if nxt > 0.0 else 0.0
        at = env._now + delay  # where simpy puts the timeout (Environment.schedule: now + delay)
        if at == self._timer_at and self._timer is not None:
            return  # the next finish has not moved: the armed timer stands
        timer = _EVENT(env)  # a timeout, scheduled as env.timeout schedules one (normal priority, delay)
        timer._ok = True
        timer._value = None
        timer.callbacks.append(self._timer_cb)
        env.schedule(timer, _NORMAL, delay)
        self._timer, self._timer_at = timer, at

    def _sum_running(self) -> None:
        """After a finish: the running jobs' total demand and their largest tolerance (a loop: the builtin max is a
        generic call compiled)."""
        jobs = self.jobs
        self._demand = left_sum([j.demand for j in jobs])
        tol = 0.0
        for j in jobs:
            if j.tol > tol:
                tol = j.tol
        self._tol = tol

    def _on_timer(self, timer: simpy.Event) -> None:
        if timer is not self._timer:
            return  # superseded by a later start or finish
        self._timer, self._timer_at = None, math.inf
        self._advance()
        te = time_eps(self.env._now)
        r = self._r
        exclusive, clock = self._exclusive, self._clock
        for j in self.jobs[:1] if exclusive else self.jobs:
            if (j.remaining if exclusive else j.end - clock) / r <= max(j.tol, te):
                j.remaining, j.end = 0.0, clock
                self._least = None  # (finishes at once: the plan after it searches again)
        self._reschedule()
