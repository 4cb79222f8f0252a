"""The replay engine: the simulator's control plane driving real torch execution of the model zoo's stages.

The control state is the very same :class:`dvasim.core.pipeline.Pipeline` (batch table, batch queues, buffer
pairs, executor state machines) and the same policy object the SimPy engine uses; this module only replaces
simulated time by real time and the simulated device by real stage modules reading and writing real buffers
(:mod:`dvasim.model.stages.buffers`).

Threads
-------
* one **executor thread per stage executor** (per stage and model instance). It blocks on its mailbox; the
  control plane puts an :class:`~dvasim.core.pipeline.Execution` there when the executor's state machine
  starts it (``Pipeline.step``). The thread copies the batch's inputs into the buffer (first stage), runs the
  stage module on the rows the mechanism gave it, writes the output rows, then reports ``Pipeline.finish`` and
  lets the control plane start whatever can start now (the paper's Figure 12 loop);
* the **front door** (the caller's thread in :meth:`ReplayEngine.run`, a helper thread in live mode): admits
  queries at their arrival times and calls the policy when its timer (a batch window) expires.

The control plane is not thread-safe; every call into it holds one lock (``ReplayEngine.lock``).

Devices
-------
* CPU: the executor threads compute directly. PyTorch's intra-op thread count is a process-wide setting: the
  replay sets it once (``threads``, default 1, the setting the CPU latency tables were profiled with, so one
  stage execution occupies one core) for the duration of the run and restores it afterwards.
* CUDA (paper §6.3): every executor owns a stream and every buffer pair of every executor (pair ``j`` of
  executor ``i`` is buffers ``(i, j)`` and ``(i+1, j)``) an event. An executor starting on pair ``j`` makes its
  own stream wait (``wait_event``, no host synchronisation) on the event of executor ``i-1``'s pair ``j``
  (the producer of its input: read-after-write) and of executor ``i+1``'s pair ``j`` (the last reader of its
  output buffer: write-after-read); it launches the stage on its stream, records its own pair's event on its
  stream, and waits on the host for that event only (its own work) before reporting the stage finished, which
  is when the control plane may hand the buffers on. All ``torch.cuda`` calls go through one small object,
  :class:`CudaOps`, so tests can substitute a recording stand-in; the real object is used unchanged wherever
  ``torch.cuda.is_available()``.
* Stage modules (``[replay] modules``): ``"cudagraph"`` (the default on CUDA through ``"auto"``), every stage of
  every lane captured by :func:`prepare` as CUDA graphs, one per batch size the policy can form on that lane
  (:meth:`dvasim.policies.base.Policy.lane_batch_sizes`: an E-Ebird or N-Ebird worker only its own size; other
  policies ``1..max_batch_size``; the warm-up passes run the same sizes) and length bucket
  (the table's lengths: an execution of length ``L`` runs at the smallest bucket ``>= L``, :meth:`ReplayEngine.bucket`,
  which is :meth:`LatencyTable.bucket` for a bucketed table), one memory pool per executor; a launch copies its
  input rows into the graph's static input and replays the graph inside the executor's stream, between its waits
  and its event record (:mod:`dvasim.model.stages.graphs`; on the CPU a stand-in with the same semantics). Otherwise
  ``"torchscript"`` (the default on the CPU) or ``"eager"`` (:mod:`dvasim.model.stages.compiled`).

Timing and the launch overhead
------------------------------
Times are ``time.perf_counter`` in ms since the run started. For every execution the engine records when the
control plane started it (``start``), when its thread began (``t_begin``), when the computation ended
(``t_end``) and when the control plane learnt it (``finish``). ``(t_begin - start) + (finish - t_end)`` is the
replay's scheduling cost of that stage launch: the hand-off to the thread plus the book-keeping after it, what
the simulator's ``[engine] launch_overhead_ms`` stands for. The buffer copies are inside ``t_begin..t_end``
(as they are in the paper's system), measured apart as ``copy_ms``.

Robustness: an overload only queues (no query is dropped); a stage that raises stops the run with a
:class:`ReplayStageError` naming the stage and the queries of the failed execution; SIGINT (Ctrl-C) stops
admitting, lets the running executions finish and returns the records collected so far (``interrupted``).

Stop requests: :func:`prepare`, :func:`replay` and :class:`ReplayEngine` take ``stop``, a callable returning why to
stop (e.g. ``"SIGTERM"``) or None, as :func:`dvasim.api.run` does (``dvasim replay`` passes its signal handlers'
answer). It is asked between two steps of the start-up (before each co-run combination of E-Ebird's offline
profile and between its rounds, between two graph captures: :class:`Stopped` is raised, with no CUDA graph capture
open), between the executors' warm-up passes, and by the front door on every wake-up (at most ``poll_s`` apart)
during the run, which then stops as for SIGINT (``interrupted``). An executor blocked inside a stage call during
its warm-up (a device hang) cannot see it: :meth:`ReplayEngine.start` waits ``warm_grace_s`` (5 s) after the
request, then abandons the run with :class:`Stopped` naming the blocked executors, instead of waiting forever.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from dvasim.core.batch_table import meta_op_counts
from dvasim.core.pipeline import Execution, Pipeline
from dvasim.core.query import Query
from dvasim.engines.common import check_one_replica
from dvasim.model.stages.buffers import BufferSet, InputStore
from dvasim.model.stages.cuda import CudaOps  # noqa: F401  (tests and callers name it here)
from dvasim.model.stages.graphs import Stopped  # noqa: F401  (raised by prepare on a stop request)

WARM_GRACE_S = 5.0  # after a stop request, how long the warm-up's executors get to notice it (ReplayEngine)

__all__ = [
    "CudaOps",
    "ReplayEngine",
    "ReplayResult",
    "ReplayStageError",
    "ReplayError",
    "Stopped",
    "check_replay_config",
    "check_table_device",
]


class ReplayError(RuntimeError):
    """The replay could not complete (a failed stage, a control-plane error)."""

    result: ReplayResult | None = None  # the records collected before the failure
    run_result: Any = None  # the same as a dvasim.api.RunResult (set by replay())


class ReplayStageError(ReplayError):
    """A stage module raised: names the stage and the queries of the failed execution."""

    def __init__(self, message: str, stage: int, query_ids: list[int], cause: BaseException):
        super().__init__(message)
        self.stage = stage
        self.query_ids = query_ids
        self.cause = cause


@dataclass
class ReplayResult:
    """Mirrors :class:`dvasim.engines.sim.engine.SimResult`, plus the real execution records."""

    queries: list[Query]
    pipeline: Pipeline
    sim_end_ms: float  # real end of the run (ms since its start), named as in SimResult
    wall_s: float
    device_busy_ms: float  # time with at least one stage computing
    stuck: str | None = None
    executions: list[dict] = field(default_factory=list)
    outputs: dict[int, Any] | None = None
    interrupted: bool = False
    device: str = "cpu"
    threads: int = 1


class _CpuBackend:
    name = "cpu"

    def __init__(self, n_exec: int):
        self.n_exec = n_exec

    def execute(self, k: int, ex: Execution, compute: Callable[[Execution], None]) -> None:
        compute(ex)

    def warmup(self, k: int, fn: Callable[[], None]) -> None:
        fn()


class _CudaBackend:
    """Streams and events (paper §6.3); see the module docstring for the discipline."""

    name = "cuda"

    def __init__(self, ops, n_lanes: int, n_stages: int, n_pairs: int):
        self.ops = ops
        self.n_stages = n_stages
        self.streams = [ops.new_stream((lane, s)) for lane in range(n_lanes) for s in range(n_stages)]
        # events[lane][stage][pair]: recorded only on the stream of executor (lane, stage)
        self.events = [[[ops.new_event((lane, s, j)) for j in range(n_pairs)] for s in range(n_stages)]
                       for lane in range(n_lanes)]

    def execute(self, k: int, ex: Execution, compute: Callable[[Execution], None]) -> None:
        ops, stream = self.ops, self.streams[k]
        ev = self.events[ex.lane]
        s, j = ex.stage, ex.slot
        if s > 0:
            ops.wait_event(stream, ev[s - 1][j])  # RAW: the producer of our input buffer (s, j)
        if s + 1 < self.n_stages:
            ops.wait_event(stream, ev[s + 1][j])  # WAR: the last reader of our output buffer (s+1, j)
        ops.launch(stream, functools.partial(compute, ex))
        ops.record_event(stream, ev[s][j])
        ops.synchronize_event(ev[s][j])  # our own work only: when the stage is done, for the control plane

    def warmup(self, k: int, fn: Callable[[], None]) -> None:
        ev = self.ops.new_event(("warmup", k))
        self.ops.launch(self.streams[k], fn)
        self.ops.record_event(self.streams[k], ev)
        self.ops.synchronize_event(ev)


# ----------------------------------------------------------------------------- the engine
class ReplayEngine:
    """Drive ``pipeline`` with real stage modules. One engine serves one run.

    ``stages[s]`` is the module of stage ``s`` (shared by all instances); ``buffers`` and ``inputs`` as in
    :mod:`dvasim.model.stages.buffers`. ``device`` is ``"cpu"`` or ``"cuda"``; ``cuda_ops`` replaces
    :class:`CudaOps` (tests). ``record_outputs`` keeps every query's output (for correctness checks).
    ``warmup`` untimed passes of every stage at every batch size ``1..warmup_rows`` (default: the buffers' rows)
    run before the clock starts; ``lane_sizes[k]``, where given, replaces ``1..warmup_rows`` for lane ``k`` (the
    sizes the policy forms there, :func:`lane_batch_sizes`). ``on_exit(queries)`` is called (outside the lock)
    with the queries that left the pipeline, ``on_fail(error)`` once if the run fails. ``stop()`` (why to stop, or
    None) is asked between warm-up passes and on every wake-up of the front door: an answer stops the run as
    SIGINT does (see the module docstring).
    """

    def __init__(self, pipeline: Pipeline, stages, buffers: BufferSet, inputs: InputStore, *,
                 device: str = "cpu", cuda_ops=None, record_outputs: bool = False, threads: int = 1,
                 stage_labels: list[str] | None = None, on_exit: Callable[[list[Query]], None] | None = None,
                 warmup: int = 2, warmup_rows: int | None = None, poll_s: float = 0.05, spin_ms: float = 0.3, on_fail: Callable[[ReplayError], None] | None = None,
                 lane_stages: list[list] | None = None, buckets: list[int] | None = None,
                 lane_sizes: list[list[int] | None] | None = None, stop: Callable[[], str | None] | None = None,
                 warm_grace_s: float = WARM_GRACE_S):
        self.pipeline = pipeline
        self.n_stages = pipeline.n_stages
        if len(stages) != self.n_stages:
            raise ValueError(f"{len(stages)} stage modules for a pipeline of {self.n_stages} stages")
        self.stages = list(stages)
        # per lane, the callables that run each stage (CUDA graphs are per lane: their static buffers)
        self.lane_stages = lane_stages or [self.stages] * pipeline.instances
        self.buckets = sorted(buckets or [])
        self.buffers = buffers
        self.inputs = inputs
        self.device = device
        n_lanes = pipeline.instances
        self.n_exec = self.n_stages * n_lanes
        if device == "cpu":
            self.backend = _CpuBackend(self.n_exec)
        elif device == "cuda":
            self.backend = _CudaBackend(cuda_ops or CudaOps(buffers.device), n_lanes, self.n_stages,
                                        pipeline.n_buffer_pairs)
        else:
            raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
        self.record_outputs = record_outputs
        self.outputs: dict[int, Any] = {}
        self.threads = int(threads)
        self.labels = stage_labels or [f"stage {s}" for s in range(self.n_stages)]
        self.on_exit = on_exit
        self.warmup_passes = int(warmup)
        self.spin_s = float(spin_ms) / 1000.0
        self.warmup_rows = min(int(warmup_rows or buffers.max_rows), buffers.max_rows)
        self.lane_sizes = list(lane_sizes) if lane_sizes is not None else [None] * n_lanes
        if len(self.lane_sizes) != n_lanes:
            raise ValueError(f"lane_sizes has {len(self.lane_sizes)} entries for {n_lanes} lanes")
        self.stop_request = stop
        self.poll_s = float(poll_s)

        self.lock = threading.Condition(threading.RLock())
        self._mail: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(self.n_exec)]
        self._threads: list[threading.Thread] = []
        # the warm-up's end: each executor marks itself warm, then waits for the clock (start())
        self._warm_cv = threading.Condition()
        self._warmed = [False] * self.n_exec
        self._go = threading.Event()
        self._abandoned = False  # executors left blocked in their warm-up (start() stopped waiting for them)
        self.warm_grace_s = float(warm_grace_s)
        self.t0 = time.perf_counter()
        self.queries: list[Query] = []
        self._sample: dict[int, int] = {}  # query id -> input sample
        self.tags: dict[int, Any] = {}  # query id -> caller's tag (live mode)
        self.on_fail = on_fail
        self.executions: list[dict] = []
        self._error: ReplayError | None = None
        self._failed: set[int] = set()
        self._stopping = False
        self._interrupted = False
        self._deadline = math.inf
        self._last_wakeup = math.nan
        self._started = False
        self._prev_threads: int | None = None
        self._front: threading.Thread | None = None
        self._closed: dict | None = None  # closed loop: next query, think time, clients' send times

    # ------------------------------------------------------------------ time
    def clock(self) -> float:
        """ms since the run started."""
        return (time.perf_counter() - self.t0) * 1000.0

    # ------------------------------------------------------------------ life cycle
    def start(self) -> None:
        """Start the executor threads, warm every stage up, then start the clock."""
        if self._started:
            raise RuntimeError("a ReplayEngine serves one run")
        self._started = True
        self._prev_threads = torch.get_num_threads()
        torch.set_num_threads(self.threads)  # process-wide (see the module docstring)
        for k in range(self.n_exec):
            t = threading.Thread(target=self._executor, args=(k,), name=f"dvasim-executor-{k}", daemon=True)
            t.start()
            self._threads.append(t)
        self._wait_warm()
        self._go.set()
        # no cyclic garbage collection while timing: a full collection can stall every thread for milliseconds
        gc.collect()
        self._gc_was_enabled = gc.isenabled()
        gc.disable()
        self.t0 = time.perf_counter()

    def _wait_warm(self) -> None:
        """Until every executor has finished its warm-up. A stop request (SIGINT, a caller's time limit) is asked
        every half second; executors that see it end their warm-up at the next pass. Those still not warm
        ``warm_grace_s`` after the stop request are blocked inside a stage call (on a GPU: a kernel or a
        synchronisation that never returns, measured once on an H200, ``traces/gpu_matrix/h200_2026-11-28/``):
        they are abandoned (daemon threads) and :class:`Stopped` names them, rather than the run waiting forever."""
        since = None
        with self._warm_cv:
            while not all(self._warmed):
                self._warm_cv.wait(timeout=0.5)
                if all(self._warmed) or self.stop_request is None:
                    continue
                why = self.stop_request()
                if why is None:
                    continue
                since = time.monotonic() if since is None else since
                if time.monotonic() - since >= self.warm_grace_s:
                    names = [self._threads[k].name for k, w in enumerate(self._warmed) if not w]
                    self._abandoned = True
                    err = Stopped(why, f"stopped by {why} during the warm-up: {', '.join(names)} still inside a "
                                       f"stage call {self.warm_grace_s:g} s later (on a GPU: a kernel or a "
                                       "synchronisation that does not return); the replay is abandoned")
                    err.blocked = names  # (callers tell a blocked device from a plain stop request by it)
                    raise err

    def _shutdown(self) -> None:
        self._go.set()
        for m in self._mail:
            m.put(None)
        for t in self._threads:
            if not self._abandoned:
                t.join()
        if getattr(self, "_gc_was_enabled", False):
            gc.enable()
        if self._prev_threads is not None:
            torch.set_num_threads(self._prev_threads)

    # ------------------------------------------------------------------ schedule mode
    def run(self, arrivals_ms, seq_lens, samples=None, *, closed_clients: int | None = None,
            think_ms: float = 0.0) -> ReplayResult:
        """Serve queries arriving at ``arrivals_ms`` (sorted, ms after the start) with input lengths
        ``seq_lens``; query ``i`` uses input sample ``samples[i]`` (default ``i``). Blocks until every query
        has left, a stage failed, or SIGINT.

        With ``closed_clients = c`` the load is a closed loop, as in the simulator: ``c`` clients each send a
        query, wait for its answer, think ``think_ms`` and send the next (``arrivals_ms`` is then ignored)."""
        qs = [Query(i, float(a), int(s)) for i, (a, s) in enumerate(zip(arrivals_ms, seq_lens))]
        if len(qs) != len(arrivals_ms) or len(arrivals_ms) != len(seq_lens):
            raise ValueError("arrivals_ms and seq_lens must have the same length")
        if closed_clients is not None:
            if closed_clients < 1:
                raise ValueError("closed_clients must be >= 1")
            for q in qs:
                q.arrival = math.nan
            self._closed = {"next": 0, "think": float(think_ms), "due": [0.0] * int(closed_clients)}
        elif any(b.arrival < a.arrival for a, b in zip(qs, qs[1:])):
            raise ValueError("arrivals_ms must be sorted (non-decreasing)")
        self.queries = qs
        for i, q in enumerate(qs):
            self._sample[q.qid] = i if samples is None else int(samples[i])
        wall0 = time.perf_counter()
        restore = self._install_sigint()
        try:
            self.start()
            stuck = self._front_door(qs)
        finally:
            with self.lock:
                self._stopping = True
            self._shutdown()
            restore()
        return self._result(stuck, time.perf_counter() - wall0)

    def _send_closed(self, now: float) -> None:
        """Closed loop: the clients whose send time has come send their next queries (under the lock)."""
        c = self._closed
        due = [t for t in c["due"] if t <= now]
        if not due:
            return
        c["due"] = [t for t in c["due"] if t > now]
        for _ in due:
            if c["next"] < len(self.queries):
                q = self.queries[c["next"]]
                c["next"] += 1
                q.arrival = now
                self.pipeline.arrive(q, now)
        self._poke(now)

    def _install_sigint(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = signal.getsignal(signal.SIGINT)

        def handler(signum, frame):
            self._interrupted = True
            signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)

        try:
            signal.signal(signal.SIGINT, handler)
        except ValueError:  # pragma: no cover - not the main interpreter
            return lambda: None
        return lambda: signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)

    def stop(self) -> None:
        """Ask the run to stop: admit nothing more, let running executions finish."""
        with self.lock:
            self._stopping = True
            self.lock.notify_all()

    def _front_door(self, qs: list[Query] | None) -> str | None:
        """Admit arrivals, serve the policy's timer; returns a stuck report if the pipeline deadlocked."""
        pipe = self.pipeline
        n = len(qs) if qs is not None else 0
        k = 0
        with self.lock:
            while True:
                now = self.clock()
                if not self._interrupted and self.stop_request is not None and self.stop_request() is not None:
                    self._interrupted = True  # a stop request: as SIGINT
                if self._interrupted:
                    self._stopping = True
                if self._stopping:
                    if len(pipe.running) <= len(self._failed):
                        return None
                    self.lock.wait(self.poll_s)
                    continue
                closed = self._closed
                if closed is not None:
                    k = n  # arrivals are decided by the clients
                    if closed["due"] and min(closed["due"]) <= now:
                        self._send_closed(now)
                        continue
                elif k < n and qs[k].arrival <= now:
                    # queries with the same arrival time reach the front door together, before it decides
                    t = qs[k].arrival
                    while k < n and qs[k].arrival == t:
                        pipe.arrive(qs[k], now)
                        k += 1
                    self._poke(now)
                    continue
                w = pipe.wakeup_time()
                if w <= now and w != self._last_wakeup:  # the policy's timer (a batch window) expired
                    self._last_wakeup = w
                    self._poke(now)
                    continue
                if qs is not None and k == n:
                    if len(pipe.exited) == n:
                        return None
                    if not pipe.running and (w == math.inf or w <= now) and not (closed and closed["due"]):
                        unfinished = [q.qid for q in qs if not q.done]
                        return (f"{len(unfinished)} of {n} queries never finished (first ids "
                                f"{unfinished[:10]}); " + pipe.stuck_report())
                nxt = min(qs[k].arrival if k < n else math.inf, w if w > now else math.inf,
                          min(closed["due"]) if closed and closed["due"] else math.inf)
                self._deadline = nxt
                timeout = self.poll_s
                if math.isfinite(nxt):
                    left = (nxt - self.clock()) / 1000.0
                    if left <= self.spin_s:
                        self._spin_until(nxt)
                        continue
                    timeout = min(timeout, left - self.spin_s)
                self.lock.wait(timeout)

    def _spin_until(self, t_ms: float) -> None:
        """The last ``spin_s`` before an arrival or a timer: poll the clock (without the lock, yielding the GIL)
        instead of a timed wait, whose wake-up is often late by tenths of a millisecond on a virtual machine."""
        self.lock.release()
        try:
            while self.clock() < t_ms and not self._stopping and not self._interrupted:
                time.sleep(0)
        finally:
            self.lock.acquire()

    def _poke(self, now: float) -> None:
        """Let the control plane start what can start now, and hand the executions to their threads."""
        if self._stopping:
            return
        for ex in self.pipeline.step(now):
            self._mail[ex.lane * self.n_stages + ex.stage].put(ex)
        if self.pipeline.wakeup_time() < self._deadline:
            self.lock.notify_all()

    # ------------------------------------------------------------------ live mode (LoadGen)
    def start_live(self) -> None:
        """Start the engine for :meth:`submit` (queries arrive when they are submitted)."""
        self.start()
        self._front = threading.Thread(target=self._front_door, args=(None,), name="dvasim-front-door", daemon=True)
        self._front.start()

    @property
    def failed(self) -> bool:
        return self._error is not None

    def submit(self, samples: list[int], tags: list | None = None) -> list[Query]:
        """Queries for input ``samples`` arrive now (thread-safe). ``tags[i]`` is kept as ``self.tags[qid]``
        (e.g. LoadGen's response id) before the query can start. Raises the run's error once it has failed."""
        with self.lock:
            if self._error is not None:
                raise self._error
            now = self.clock()
            out = []
            for i, smp in enumerate(samples):
                q = Query(len(self.queries), now, int(self.inputs.seq_lens[smp]))
                self.queries.append(q)
                self._sample[q.qid] = int(smp)
                if tags is not None:
                    self.tags[q.qid] = tags[i]
                self.pipeline.arrive(q, now)
                out.append(q)
            self._poke(now)
            return out

    def finish_live(self) -> ReplayResult:
        """Stop after the running executions and return the result."""
        wall0 = self.t0
        self.stop()
        if self._front is not None:
            self._front.join()
        self._shutdown()
        return self._result(None, time.perf_counter() - wall0)

    # ------------------------------------------------------------------ executor threads
    def _executor(self, k: int) -> None:
        torch.set_num_threads(self.threads)
        stage = k % self.n_stages
        lane = k // self.n_stages
        with torch.inference_mode():
            try:
                # every batch size once per pass: oneDNN builds a convolution primitive per input shape,
                # a few ms the first time, which must not land in the timed run
                # (graph stages: every captured graph once per pass, each length bucket too; a graph's first
                # replay uploads it to the device)
                lengths = self.buckets or [self.buffers.max_len]
                for _ in range(self.warmup_passes):
                    if self.stop_request is not None and self.stop_request() is not None:
                        break  # the front door stops the run at once
                    for rows in self.warm_sizes(lane):
                        for L in lengths:
                            self.backend.warmup(k, lambda r=rows, n=L: self._warm(lane, stage, r, n))
            except Exception as e:  # a stage that cannot even run: fail the first execution it gets
                warm_error = e
            else:
                warm_error = None
            with self._warm_cv:
                self._warmed[k] = True
                self._warm_cv.notify_all()
            self._go.wait()
            while True:
                ex = self._mail[k].get()
                if ex is None:
                    return
                t_begin = self.clock()
                try:
                    if warm_error is not None:
                        raise warm_error
                    self.backend.execute(k, ex, self._compute)
                    if self.record_outputs and ex.stage == self.n_stages - 1:
                        self._collect(ex)
                except Exception as e:
                    self._fail(ex, e)
                    continue
                t_end = self.clock()
                with self.lock:
                    now = self.clock()
                    n0 = len(self.pipeline.exited)
                    try:
                        self.pipeline.finish(ex, now)
                    except Exception as e:  # a policy or mechanism error: stop the run
                        self._fail(ex, e, control=True)
                        continue
                    self.executions.append(self._record(ex, t_begin, t_end, now))
                    done = self.pipeline.exited[n0:]
                    if self._closed is not None and done and not self._stopping:
                        self._closed["due"].extend([now + self._closed["think"]] * len(done))
                        self._send_closed(now)  # think 0: the clients send at once
                        if self._closed["think"] > 0:
                            self.lock.notify_all()  # the front door sends them later
                    self._poke(now)
                    if self._stopping or (self.queries and len(self.pipeline.exited) == len(self.queries)):
                        self.lock.notify_all()
                if done and self.on_exit is not None:
                    self.on_exit(done)

    def warm_sizes(self, lane: int) -> list[int]:
        """The batch sizes lane ``lane`` is warmed up at: its ``lane_sizes`` where given (up to the buffers'
        rows), else ``1..warmup_rows``."""
        sizes = self.lane_sizes[lane]
        if sizes is None:
            return list(range(1, self.warmup_rows + 1))
        return [b for b in sorted(set(sizes)) if 1 <= b <= self.buffers.max_rows]

    def _warm(self, lane: int, stage: int, rows: int, L: int | None = None) -> None:
        L = self.buffers.max_len if L is None else L
        self.lane_stages[lane][stage](self.buffers.read(lane, stage, 0, range(rows), L))

    def bucket(self, length: int) -> int:
        """The length an execution runs at: its padded length, or with length buckets (CUDA graphs) the
        smallest bucket that holds it."""
        for b in self.buckets:
            if b >= length:
                return b
        return length

    def _compute(self, ex: Execution) -> None:
        lane, s, j, rows = ex.lane, ex.stage, ex.slot, ex.rows
        L = self.bucket(ex.seq_len)
        samples = [self._sample[q.qid] for q in ex.queries] if s == 0 else None
        if ex.padded_size > len(rows) and rows.start + ex.padded_size <= self.buffers.max_rows:
            # a padding policy (tfserving-static): the dummy rows (copies of the first input) run too; their
            # outputs sit in rows no query reads
            if samples is not None:
                samples += samples[:1] * (ex.padded_size - len(rows))
            rows = range(rows.start, rows.start + ex.padded_size)
        ex.info = {"rows_run": len(rows)}  # (the simulator leaves it None: no dict per execution)
        t = time.perf_counter()
        if s == 0:
            x = self.inputs.gather(samples, L)
            self.buffers.write(lane, 0, j, rows, x, L)
        carry = self.buffers.read(lane, s, j, rows, L)
        t_in = time.perf_counter()
        out = self.lane_stages[lane][s](carry)
        t_out = time.perf_counter()
        self.buffers.write(lane, s + 1, j, rows, out, L)
        ex.info["copy_ms"] = ((t_in - t) + (time.perf_counter() - t_out)) * 1000.0

    def _collect(self, ex: Execution) -> None:
        out = self.buffers.read(ex.lane, self.n_stages, ex.slot, ex.rows, self.bucket(ex.seq_len))
        for i, q in enumerate(ex.queries):
            self.outputs[q.qid] = _rows_to_cpu(out, i)

    def _record(self, ex: Execution, t_begin: float, t_end: float, finish: float) -> dict:
        return {
            "stage": ex.stage, "lane": ex.lane, "slot": ex.slot, "batch_id": ex.item.bid,
            "row_start": ex.rows.start, "batch_size": ex.batch_size, "seq_len": ex.seq_len,
            "table_ms": ex.standalone_ms, "start_ms": ex.start, "begin_ms": t_begin, "end_ms": t_end,
            "finish_ms": finish, "handoff_ms": t_begin - ex.start, "bookkeeping_ms": finish - t_end,
            "compute_ms": t_end - t_begin, "copy_ms": (ex.info or {}).get("copy_ms", math.nan),
            "rows_run": (ex.info or {}).get("rows_run", ex.batch_size),
            "query_ids": [q.qid for q in ex.queries],
        }

    def _fail(self, ex: Execution, e: BaseException, control: bool = False) -> None:
        qids = [q.qid for q in ex.queries]
        where = (f"lane {ex.lane}, batch {ex.item.bid}, buffer pair {ex.slot}, batch size {ex.batch_size}"
                 + (f", seq_len {ex.seq_len}" if self.inputs.kind == "tokens" else ""))
        if control:
            err: ReplayError = ReplayError(
                f"control plane failed after stage {ex.stage} on queries {qids} ({where}): {type(e).__name__}: {e}")
        else:
            err = ReplayStageError(
                f"stage {ex.stage} ({self.labels[ex.stage]}) failed on queries {qids} ({where}): "
                f"{type(e).__name__}: {e}", ex.stage, qids, e)
        with self.lock:
            first = self._error is None
            if first:
                self._error = err
            self._failed.add(id(ex))
            self._stopping = True
            self.lock.notify_all()
        if first and self.on_fail is not None:
            self.on_fail(err)

    # ------------------------------------------------------------------ result
    def _result(self, stuck: str | None, wall_s: float) -> ReplayResult:
        ivs = sorted((r["begin_ms"], r["end_ms"]) for r in self.executions)
        busy, cur_s, cur_e = 0.0, None, None
        for s, e in ivs:
            if cur_e is None or s > cur_e:
                if cur_e is not None:
                    busy += cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        if cur_e is not None:
            busy += cur_e - cur_s
        end = max([q.finish for q in self.queries if q.done], default=0.0)
        res = ReplayResult(self.queries, self.pipeline, end, wall_s, busy, stuck, self.executions,
                           self.outputs if self.record_outputs else None, self._interrupted, self.device,
                           self.threads)
        if self._error is not None:
            self._error.result = res
            raise self._error
        return res


def _rows_to_cpu(carry, i: int):
    if carry is None:
        return None
    if isinstance(carry, torch.Tensor):
        return carry[i].detach().to("cpu", copy=True)
    return type(carry)(_rows_to_cpu(c, i) for c in carry)


# ----------------------------------------------------------------------------- from a config
@dataclass
class ReplaySetup:
    """Everything one replay run needs, built from a config exactly as :func:`dvasim.api.run` builds the
    simulator's (same profile, policy, workload and pipeline classes), plus the real model."""

    cfg: dict
    resolved: Any  # dvasim.model.catalog.ResolvedModel
    policy: Any
    workload: Any
    pipeline: Pipeline
    model: Any  # ZooModel
    stages: list
    labels: list[str]
    buffers: BufferSet
    inputs: InputStore
    device: str
    buckets: list[int] = field(default_factory=list)  # length buckets (cudagraph stages of token models)
    lane_stages: list[list] | None = None  # per lane, the stage callables (CUDA graphs); None: ``stages``

    @property
    def profile(self):
        return self.resolved.table


def _zoo(name: str, variant: str, device: str):
    key = (name, variant, device)
    if key not in _ZOO_CACHE:
        from dvasim.model import zoo

        _ZOO_CACHE[key] = zoo.build(name, variant, seed=0, device=device)
    return _ZOO_CACHE[key]


_ZOO_CACHE: dict = {}
_STAGE_CACHE: dict = {}


def _stages(model, resolved, bounds: list[int], kind: str, device: str) -> list:
    """The stage modules (TorchScript ones are traced once per model, cuts and device, then reused)."""
    from dvasim.model.stages.compiled import stage_modules

    key = (resolved.name, resolved.variant, device, tuple(bounds), kind)
    if key not in _STAGE_CACHE:
        _STAGE_CACHE[key] = stage_modules(model, bounds, kind)
    return _STAGE_CACHE[key]


def prepare(config, overrides: list[str] | None = None, *, device: str = "cpu", record_states: bool = False,
            seq_lens=None, table=None, cuda_ops=None, threads: int = 1,
            stop: Callable[[], str | None] | None = None) -> ReplaySetup:
    """Resolve ``config`` and build the pipeline, the real stage modules, the buffers and the inputs.

    ``seq_lens`` replaces the workload's input lengths as the input samples (LoadGen's sample library).
    ``table`` (a per-stage latency table or its path) replaces the named model's table as the profile the
    policy decides with, e.g. the one the simulator is given in ``dvasim validate --table serving``, so both
    engines make their decisions from the same numbers. A policy that profiles co-running workers (E-Ebird) gets
    the replay's profiler (:class:`dvasim.engines.replay.corun.ReplayCoRun`: measured on these stage modules,
    with ``threads`` intra-op threads on the CPU, the replay's setting). ``stop()`` (why to stop, or None) is
    asked between the profile's co-runs and between graph captures: an answer raises :class:`Stopped` there.
    """
    cfg, resolved, policy, workload = _checked(config, overrides, device, table)
    profile = resolved.table
    dev = "cuda" if device == "cuda" else "cpu"
    model, kind, stages, labels = _real_stages(cfg, resolved, dev)
    lens, buckets = _lengths(model, kind, profile, workload.seq_lens if seq_lens is None else seq_lens)
    corun = None
    if getattr(policy, "needs_corun", False):
        from dvasim.engines.replay.corun import ReplayCoRun

        corun = ReplayCoRun(model, stages, device=dev, modules=kind, ops=cuda_ops, threads=threads,
                            buckets=buckets, seed=int(cfg["workload"].get("seed", 0)), stop=stop)
    eng = cfg["engine"]
    pipeline = Pipeline(profile, policy, eng["buffer_pairs"], record_states=record_states,
                        instances=eng["instances"], qos_target_ms=cfg["qos"]["target_ms"],
                        input_lengths=workload.seq_lens if profile.seq_lens is not None else None, corun=corun)
    inputs = InputStore(model, lens, seed=int(cfg["workload"].get("seed", 0)), device=dev, pin=dev == "cuda")
    buffers = BufferSet(model, list(resolved.bounds), pipeline.instances, eng["buffer_pairs"], profile.max_batch_size,
                        max_len=max([inputs.max_len, *buckets]), device=dev)
    setup = ReplaySetup(cfg, resolved, policy, workload, pipeline, model, stages, labels, buffers, inputs, device,
                        buckets=buckets)
    if kind == "cudagraph":
        setup.lane_stages = _graph_stages(setup, cuda_ops, stop=stop)
    return setup


def _checked(config, overrides, device: str, table):
    """Every check :func:`prepare` makes before it builds anything (no torch work): the resolved config and
    model, the policy and the workload."""
    from dvasim.engines.common import policy_from_section, workload_for_table

    cfg, resolved = _resolve(config, overrides, device, table)
    return cfg, resolved, policy_from_section(cfg["policy"]), workload_for_table(cfg, resolved.table)


def check_replay_config(config, overrides: list[str] | None = None, *, device: str = "cpu", table=None) -> dict:
    """The resolved ``config`` after every check :func:`prepare` makes on it, without building a model: what
    ``dvasim validate`` checks before its simulation writes anything. Raises a
    :class:`~dvasim.errors.DvasimError` naming the field."""
    return _checked(config, overrides, device, table)[0]


GPU_TABLES = ("titanrtx", "a100", "h100")  # [model] devices whose tables are a GPU's (dvasim.model.catalog)


def gpu_table_name(gpu: str) -> str | None:
    """The ``[model] device`` whose shipped tables were measured (or modelled) on the GPU named ``gpu`` (as
    ``torch.cuda.get_device_name`` says it: "NVIDIA H100 80GB HBM3" is ``h100``), or ``None``."""
    flat = "".join(ch for ch in gpu.lower() if ch.isalnum())
    return next((d for d in GPU_TABLES if d in flat), None)


def check_table_device(model_cfg: dict, device: str, gpu: str | None = None) -> None:
    """The policy of a replay decides with the table of ``[model] device``: refuse a table of another machine
    (Titan RTX times while CPU modules run). A CPU replay takes ``device = "cpu"``; a GPU replay the table of
    that GPU (``gpu``: its name, default ``torch.cuda.get_device_name()``), e.g. ``h100`` on an H100."""
    from dvasim.errors import ConfigError

    if "name" not in model_cfg:
        return  # a table instead of a named model: _resolve refuses it
    have = model_cfg.get("device", "titanrtx")
    if device != "cuda":
        if have != "cpu":
            raise ConfigError("model.device", f"{have!r} is another machine's latency table, but this replay runs "
                                              "on the CPU: the policy would decide with the wrong times; set "
                                              'device = "cpu" (the small variants, measured on a CPU), or replay '
                                              "with --device cuda on that GPU")
        return
    gpu = gpu if gpu is not None else torch.cuda.get_device_name()
    want = gpu_table_name(gpu)
    if want is None:
        raise ConfigError("model.device", f"no shipped table was measured on this GPU ({gpu}; tables: "
                                          f"{', '.join(GPU_TABLES)}); dvasim validate --device cuda profiles the "
                                          "stages on it first, or give replay(config, table=...) a table of it")
    if have != want:
        raise ConfigError("model.device", f"{have!r} is another machine's latency table, but this replay runs on "
                                          f"{gpu}: the policy would decide with the wrong times; set "
                                          f'device = "{want}"')


def _resolve(config, overrides, device: str, table):
    """The resolved config and model (``table``, if given, as the model's table), checked for the replay."""
    from dvasim import config as cfgmod
    from dvasim.errors import ConfigError
    from dvasim.model.catalog import resolve_model

    cfg = cfgmod.resolve(config, overrides)
    if "table" in cfg["model"]:
        raise ConfigError("model.table", 'the replay runs the real stage modules of the model zoo: give name = '
                                         '"resnet152", device = "cpu", stages = N instead of a table')
    check_one_replica(cfg["cluster"])
    if device not in ("cpu", "cuda"):
        raise ConfigError("device", f"must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", "cuda is not available on this machine; use --device cpu")
    tr = cfg["engine"].get("transfer")
    if isinstance(tr, dict) and tr.get("mode", "none") != "none":
        raise ConfigError("engine.transfer.mode", "the replay does not model input copies (the memory pool or "
                                                  "copies on launch): its inputs are already where the stages run; "
                                                  'remove [engine.transfer] or set mode = "none"')
    resolved = resolve_model(cfg["model"])
    if table is not None:
        import dataclasses

        from dvasim.model.table import LatencyTable

        tab = table if isinstance(table, LatencyTable) else LatencyTable.load(table)
        if tab.n_stages != resolved.table.n_stages:
            raise ConfigError("table", f"has {tab.n_stages} stages; the model is cut into {resolved.table.n_stages}")
        resolved = dataclasses.replace(resolved, table=tab)
    return cfg, resolved


def _real_stages(cfg: dict, resolved, dev: str):
    """The zoo model on ``dev``, the module kind (``[replay] modules`` resolved, written back into ``cfg``), the
    stage modules (eager ones for CUDA graphs, which capture them later) and the stages' labels."""
    model = _zoo(resolved.name, resolved.variant, dev)
    bounds = list(resolved.bounds)
    ends = [*bounds[1:], model.n_ops()]
    kind = modules_for(cfg["replay"]["modules"], dev)
    cfg["replay"] = {**cfg["replay"], "modules": kind}
    stages = _stages(model, resolved, bounds, "eager" if kind == "cudagraph" else kind, dev)
    names = model.op_names
    labels = [f"ops {a}..{b - 1}: {names[a]} .. {names[b - 1]}" if b - a > 1 else f"op {a}: {names[a]}"
              for a, b in zip(bounds, ends)]
    return model, kind, stages, labels


def _lengths(model, kind: str, profile, lens) -> tuple[list, list[int]]:
    """The input samples' lengths (1 for images) and the length buckets (CUDA graphs of token models: the
    table's lengths up to the first that holds the longest input)."""
    from dvasim.errors import WorkloadError

    buckets: list[int] = []
    if model.input_kind != "tokens":
        return [1] * len(lens), buckets
    top = int(max(lens))
    if top > int(model.max_seq_len):
        raise WorkloadError("workload.seq_len", f"inputs up to {top} tokens; the model takes at most "
                                                f"{model.max_seq_len}")
    if kind == "cudagraph":  # graphs have fixed shapes: the table's lengths are the buckets
        buckets = [int(L) for L in profile.seq_lens if int(L) <= int(model.max_seq_len)]
        if not buckets or buckets[-1] < top:
            raise WorkloadError("workload.seq_len", f"inputs up to {top} tokens; the table's length buckets "
                                                    f"end at {buckets[-1] if buckets else 0}")
        buckets = [L for L in buckets if L <= min(b for b in buckets if b >= top)]
    return lens, buckets


def modules_for(kind: str, device: str) -> str:
    """``[replay] modules`` for a device: ``"auto"`` is CUDA graphs on CUDA, TorchScript on the CPU."""
    if kind == "auto":
        return "cudagraph" if device == "cuda" else "torchscript"
    return kind


def lane_batch_sizes(policy, lanes: int, top: int) -> list[list[int] | None]:
    """Per lane, the batch sizes ``policy`` can form there (its :meth:`~dvasim.policies.base.Policy.lane_batch_sizes`)
    or None where it may form any size ``1..top``. A size outside ``1..top`` (the buffers' rows) is refused."""
    ask = getattr(policy, "lane_batch_sizes", None)
    out: list[list[int] | None] = []
    for lane in range(lanes):
        sizes = ask(lane) if callable(ask) else None
        if sizes is not None:
            sizes = sorted({int(b) for b in sizes})
            if not sizes or sizes[0] < 1 or sizes[-1] > top:
                raise ValueError(f"policy {getattr(policy, 'name', policy)!r}: lane {lane}'s batch sizes {sizes} "
                                 f"are not a non-empty subset of 1..{top}")
        out.append(sizes)
    return out


def graph_batch_sizes(setup: ReplaySetup) -> list[list[int]]:
    """Per lane, the batch sizes its CUDA graphs are captured at: the policy's own for the lane
    (:func:`lane_batch_sizes`), else ``1..top`` (top: the policy's ``max_batch_size``, or the table's largest)."""
    top = int(getattr(setup.policy, "max_batch_size", None) or setup.profile.max_batch_size)
    top = min(top, setup.buffers.max_rows)
    given = lane_batch_sizes(setup.policy, setup.pipeline.instances, setup.buffers.max_rows)
    return [list(range(1, top + 1)) if sizes is None else sizes for sizes in given]


_GRAPH_REUSE: dict | None = None  # inside reused_graphs(): captured graphs by what they were captured for


@contextlib.contextmanager
def reused_graphs():
    """Within the block, :func:`prepare` captures the CUDA graphs of one set of stage modules (one model, cut and
    device: the modules are cached per process) at one set of lanes, batch sizes and length buckets once, and
    the replays after the first reuse them (their counters ``launches`` and ``copy_ms`` reset), instead of
    capturing them again for every replay. Safe because the replays of one process run one after the other and a
    graph's static inputs are its own copies (:mod:`dvasim.model.stages.graphs`): a later replay's buffers only
    feed them. A sequence of replays of the same model (``experiments/validation/gpu_matrix.py``) pays the capture
    once; outside the block every :func:`prepare` captures its own (the default). Not with a ``cuda_ops``
    stand-in (tests count its captures). The graphs are dropped when the block ends."""
    global _GRAPH_REUSE
    outer = _GRAPH_REUSE
    _GRAPH_REUSE = {} if outer is None else outer
    try:
        yield
    finally:
        _GRAPH_REUSE = outer


def _graph_stages(setup: ReplaySetup, cuda_ops=None, stop: Callable[[], str | None] | None = None) -> list[list]:
    """Every stage of every lane captured at every batch size the policy can form on that lane
    (:func:`graph_batch_sizes`) and every length bucket; ``stop`` asked between captures. Inside
    :func:`reused_graphs`, graphs captured earlier for the same modules, lanes, sizes and buckets are reused."""
    from dvasim.model.stages.graphs import capture_stages, graph_ops

    ops = cuda_ops if cuda_ops is not None else graph_ops(setup.buffers.device if setup.device == "cuda" else "cpu")
    sizes = graph_batch_sizes(setup)
    key = (id(setup.stages), str(setup.buffers.device), tuple(map(tuple, sizes)), tuple(setup.buckets or [1]))
    reuse = _GRAPH_REUSE if cuda_ops is None else None
    if reuse is not None and key in reuse:
        lanes = reuse[key][1]
        for st in (st for lane in lanes for st in lane):
            st.launches, st.copy_ms = 0, 0.0
        return lanes
    lanes = capture_stages(setup.stages, setup.buffers, ops, lambda lane: sizes[lane], setup.buckets or [1],
                           lanes=setup.pipeline.instances,
                           progress=bool(setup.cfg["engine"].get("progress")) or sys.stderr.isatty(), stop=stop)
    if reuse is not None:
        reuse[key] = (setup.stages, lanes)  # (the modules kept alive with their graphs: the key holds their id)
    return lanes


def make_engine(setup: ReplaySetup, device: str | None = None, **kwargs) -> ReplayEngine:
    """The engine for ``setup`` (``device`` overrides the setup's, e.g. the CUDA path with a stand-in); its
    warm-up runs each lane's batch sizes as the policy announces them (:func:`lane_batch_sizes`)."""
    kwargs.setdefault("warmup_rows", getattr(setup.policy, "max_batch_size", None))
    kwargs.setdefault("lane_sizes", lane_batch_sizes(setup.policy, setup.pipeline.instances, setup.buffers.max_rows))
    return ReplayEngine(setup.pipeline, setup.stages, setup.buffers, setup.inputs,
                        device=device or setup.device, stage_labels=setup.labels, lane_stages=setup.lane_stages,
                        buckets=setup.buckets, **kwargs)


def admission_delays(queries: list[Query]):
    """How late the front door saw each query after its arrival (ms; queries never seen are left out)."""
    import numpy as np

    late = np.array([q.seen - q.arrival for q in queries], dtype=float)
    return late[np.isfinite(late)]


def overhead_stats(executions: list[dict], queries: list[Query] | None = None) -> dict[str, float]:
    """The replay's own scheduling cost per stage launch (see the module docstring), in ms, and how late the
    front door saw the queries after their arrival (``admission_delay_ms_*``, the simulator's
    ``[engine] admission_delay_ms``)."""
    import numpy as np

    out: dict[str, float] = {}
    late = admission_delays(queries or [])
    if len(late):
        out.update(admission_delay_ms_mean=float(late.mean()), admission_delay_ms_p50=float(np.median(late)),
                   admission_delay_ms_p90=float(np.percentile(late, 90)))
    if not executions:
        return out
    h = np.array([r["handoff_ms"] for r in executions])
    b = np.array([r["bookkeeping_ms"] for r in executions])
    c = np.array([r["copy_ms"] for r in executions])
    tot = h + b
    return out | {
        "launch_overhead_ms_mean": float(tot.mean()), "launch_overhead_ms_p50": float(np.median(tot)),
        "launch_overhead_ms_p90": float(np.percentile(tot, 90)),
        "handoff_ms_mean": float(h.mean()), "bookkeeping_ms_mean": float(b.mean()),
        "copy_ms_mean": float(np.nanmean(c)) if np.isfinite(c).any() else math.nan,
        "n_launches": len(executions),
    }


def to_run_result(setup: ReplaySetup, res: ReplayResult, extra_summary: dict | None = None):
    """A :class:`dvasim.api.RunResult` with the same summary fields as the simulator's, plus the replay's."""
    from dvasim.reporting.metrics import records_frame, summarize
    from dvasim.reporting.result import RunResult

    profile, policy, cfg = setup.profile, setup.policy, setup.cfg
    eng = cfg["engine"]
    df = records_frame(res.queries, profile.n_stages)
    summary = summarize(df, cfg["qos"]["target_ms"])
    summary.update(
        policy=policy.name, model=profile.name, n_stages=profile.n_stages, buffer_pairs=eng["buffer_pairs"],
        instances=res.pipeline.instances,  # a policy may bring its own workers (E2bird)
        device_busy_fraction=res.device_busy_ms / res.sim_end_ms if res.sim_end_ms > 0 else 0.0,
        **meta_op_counts(res.pipeline.table),
        engine="replay", replay_device=res.device, replay_threads=res.threads, replay_wall_s=res.wall_s,
        replay_modules=cfg["replay"]["modules"],
        # a replay serves on the real thing: its stages' module kind on its device (the simulator's stacks of the
        # same names model them on the H100 host: dvasim.server.stacks)
        stack=f"real {modules_for(cfg['replay']['modules'], res.device)} stages on {res.device}",
        interrupted=res.interrupted,
    )
    summary.update(overhead_stats(res.executions, res.queries))
    if setup.lane_stages is not None:  # CUDA graphs: the one input copy per launch into the static buffers
        n = sum(st.launches for lane in setup.lane_stages for st in lane)
        summary["graph_copy_ms_mean"] = (sum(st.copy_ms for lane in setup.lane_stages for st in lane) / n
                                         if n else math.nan)
    if extra_summary:
        summary.update(extra_summary)
    resolved = {**cfg, "policy": {**cfg["policy"], **policy.describe()}}
    resolved["model"] = {**cfg["model"], "provenance": dict(getattr(profile, "provenance", {})),
                         "bounds": list(setup.resolved.bounds), "variant": setup.resolved.variant}
    resolved["replay"] = {**cfg["replay"], "device": res.device, "threads": res.threads, "stages": setup.labels}
    return RunResult(df, summary, resolved, res.stuck, extra={"replay": res, "setup": setup})


def replay(config, overrides: list[str] | None = None, *, device: str = "cpu", threads: int = 1,
           record_outputs: bool = False, record_states: bool = False, cuda_ops=None, warmup: int = 2,
           table=None, stop: Callable[[], str | None] | None = None):
    """Replay one config on real torch execution; returns a :class:`dvasim.api.RunResult` like
    :func:`dvasim.api.run` (``extra["replay"]`` holds the :class:`ReplayResult`). ``stop()`` (why to stop, or
    None): during the start-up an answer raises :class:`Stopped` (nothing ran), during the run it stops the run as
    SIGINT does (the result is ``interrupted``)."""
    setup = prepare(config, overrides, device=device, record_states=record_states, table=table, cuda_ops=cuda_ops,
                    threads=threads, stop=stop)
    engine = make_engine(setup, record_outputs=record_outputs, threads=threads, cuda_ops=cuda_ops, warmup=warmup,
                         stop=stop)
    try:
        res = engine.run(setup.workload.arrivals_ms, setup.workload.seq_lens,
                         closed_clients=setup.workload.closed_clients, think_ms=setup.workload.think_ms)
    except ReplayError as e:
        if e.result is not None:
            e.run_result = to_run_result(setup, e.result)
        raise
    return to_run_result(setup, res)


def write_executions(result, out_dir) -> None:
    """``executions.csv``: one row per stage execution with its real timings (the overhead's raw data)."""
    import pandas as pd

    res = result.extra.get("replay")
    if res is None or not res.executions:
        return
    from dvasim.outputs import atomic_path

    rows = [{k: v for k, v in r.items() if k != "query_ids"} | {"n_queries": len(r["query_ids"])}
            for r in res.executions]
    with atomic_path(f"{out_dir}/executions.csv") as tmp:  # a full disk leaves no half-written file
        pd.DataFrame(rows).sort_values("start_ms").to_csv(tmp, index=False)
