"""The SimPy engine: stage executions, arrivals and the front door's timer as callbacks of SimPy events.

:func:`simulate` builds a :class:`Simulation` and runs it: the simulation's methods are the callbacks (and the
closed loop's client processes) that move the run along (arrivals, the front door's timer, stage executions and their completions, the closed
loop's clients), its attributes the state they share.

The control state (batch table, batch queues, buffer pairs, executor states, policy) lives in
:class:`dvasim.core.pipeline.Pipeline`; this module only adds time: arrivals at their instants, stage executions
that take the time the :class:`~dvasim.engines.sim.device.Device` gives them, and the policy's wake-ups.

A run stops early when asked: the ``stop`` option (a callable the command line's signal handlers answer) is
looked at every :data:`STOP_EVERY` events, and Ctrl-C in Python (``KeyboardInterrupt``) stops it too. Either way the
result keeps what was collected, and the queries that had not arrived yet are left out of the records
(:meth:`dvasim.reporting.records.RecordStore.leave_out`). A full disk while the records stream
(:class:`~dvasim.errors.OutputError`) is never made a soft failure: it ends the run with that error.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Final

import numpy as np
import simpy

from dvasim.core.pipeline import Execution
from dvasim.core.query import Query
from dvasim.engines.sim.collector import spaced_collections
from dvasim.engines.sim.device import Device
from dvasim.engines.sim.result import (  # noqa: F401  (re-exported)
    DeadlockError,
    SimOptions,
    SimResult,
    SimulationStuck,
    StopRequested,
)
from dvasim.errors import OutputError
from dvasim.progress import NoBar, progress_bar
from dvasim.reporting.records import RecordStore

# (Final: constants to a compiled core, not looked up in simpy's modules at each use)
_URGENT: Final = simpy.events.URGENT  # an event due before the normal ones of its instant
_EVENT: Final = simpy.Event


STOP_EVERY = 1 << 10  # events between two looks at the stop request (a few milliseconds of a run at most)


def _run_watched(env: simpy.Environment, pipeline: Any, limit: int,  # what has a stuck_report() (a cluster's too)
                 stop: Callable[[], str | None] | None = None) -> None:
    """``env.run()``, stopping with :class:`SimulationStuck` when ``limit`` events in a row leave the clock where
    it was, and with :class:`StopRequested` when ``stop()`` (asked before the first event and then every
    :data:`STOP_EVERY` events) says why. (The clock is read from the environment's own attribute: this loop runs
    once per event.)"""
    step = env.step
    t_prev, same = env.now, 0
    look = 1 if stop is not None else -1  # events until the next look (never 0 without a stop)
    try:
        while True:
            look -= 1
            if not look:
                why = stop()  # type: ignore[misc]  # (look never reaches 0 without a stop)
                if why:
                    raise StopRequested(why)
                look = STOP_EVERY
            step()
            now = env._now
            if now != t_prev:
                t_prev, same = now, 0
                continue
            same += 1
            if same > limit:
                raise SimulationStuck(f"no progress in simulated time for {limit:,} events at {env.now:.6f} ms; "
                                      + pipeline.stuck_report())
    except simpy.core.EmptySchedule:
        return


def simulate(pipeline: Any, arrivals_ms, seq_lens, **options) -> SimResult:  # a Pipeline, or a stand-in
    """Run ``pipeline`` on the given arrivals. Every query is in the result, finished or not.

    With ``closed_clients = c`` the load is a closed loop instead: ``c`` clients each send a query, wait for its
    answer, think for ``think_ms`` and send the next, until all ``len(seq_lens)`` queries are sent (the given
    arrival times are then ignored and replaced by the times the queries were sent).

    An interrupt (Ctrl-C, or ``stop()`` returning a reason: it is asked every :data:`STOP_EVERY` events of a run
    without ``until_ms``) stops the run and returns what was collected, the queries that had not arrived left out
    (the result's ``interrupted`` and ``n_not_arrived``); with ``fail_soft`` so does any error but a full disk (the
    result's ``stuck`` says what happened). A watchdog stops a run whose clock has not advanced for
    ``watchdog_events`` events in a row (a livelock: something re-arming itself at the same instant) with
    :class:`SimulationStuck`, naming the executors' states, the queues and the buffers.

    ``launch_overhead_ms`` delays every stage launch; with ``sharing = "cores"`` it is CPU work done on the cores.
    ``service_cv > 0`` makes every execution's time random around the table's: the table time times a
    log-normal factor of mean 1 and coefficient of variation ``service_cv`` (a real device's run-to-run jitter,
    which fattens the latency tail), drawn from a generator seeded with ``seed`` in launch order (the same
    config and seed give the same run).
    ``admission_delay_ms`` is the time between a query's arrival and the moment the front door sees it (a
    server's receiving thread waking up); its latency still counts from the arrival. A list is the quantiles
    (at evenly spaced levels from 0 to 1) of a measured delay distribution: every query draws its own delay
    (seeded like the jitter), and the front door sees the queries in arrival order, each no earlier than the
    one before it (one receiving thread).

    ``host`` (a :class:`dvasim.server.host.HostModel`, ``[engine.host]``) models the host of a GPU run: every stage
    launch then costs host time on the host's launching cores, its Python-level part holds one interpreter lock,
    and the table's time is the GPU's, run on the device while the kernels are launched (see
    :mod:`dvasim.server.host`).

    Every query's record goes to ``records`` (a :class:`~dvasim.reporting.records.RecordStore`, in memory or streaming to
    Parquet; a new in-memory one if not given) as it leaves, and at the end for those that did not. Queries are
    made as they reach the pipeline and dropped when they leave, unless ``keep_queries`` (then the result's
    ``queries`` holds them all): memory stays bounded by what is in flight.

    ``transfer`` (a :class:`dvasim.server.transfer.Transfer`, ``[engine.transfer]``) models the inputs' host-to-GPU
    copies: ``"pool"`` (E2bird's memory pool) makes the front door see a query only when its copy, one at a time
    in arrival order, is done; ``"on_launch"`` (TF-Serving) copies a batch's inputs before its first stage
    computes (see :mod:`dvasim.server.transfer`). ``None``: no transfer modelled.

    ``batch_costs`` (a :class:`dvasim.server.costs.BatchCosts`, from the run's serving stack; needs ``host``) adds
    the per-batch host costs: at every first-stage launch the requests' handling and the inputs' gathering (under
    the interpreter lock for a Python stack), then their host-to-device copy on the one link; after every
    last-stage completion the synchronisation and the outputs' copy back. Where the stack's batch thread leaves the
    GPU idle between its batches (TF-Serving, a Python loop) the entry comes before the GPU starts and the exit
    holds the executor; where it does not (Triton's TensorRT backend copies the next batch's inputs while the
    current one runs, and a completion thread answers) the entry runs on the host beside the GPU's work (the device
    sees no gap: exact at saturation, at most one entry optimistic for a batch reaching an idle server) and the
    exit delays only the answers.
    ``corun_per_worker = k`` slows every execution by ``1 + k * (n - 1)`` while ``n`` run at once.
    ``contention = "overlap"`` makes every running execution claim at least ``contention_share`` of the device
    (:mod:`dvasim.engines.sim.device`); ``"none"`` (default): the sharing model alone."""
    return Simulation(pipeline, arrivals_ms, seq_lens, SimOptions(**options)).run()


class Simulation:
    """One run of :func:`simulate`: ``Simulation(pipeline, arrivals, lens, SimOptions(...)).run()`` is
    ``simulate(pipeline, arrivals, lens, ...)``.

    Holds the SimPy environment, the device (and, with a host model, the host's launching cores, its interpreter
    lock and the host-to-device link), the queries made so far, one executor per stage of every instance (a
    mailbox slot each: the execution handed to it) and the front door's timer. Its methods are what happens in
    the run: the arrivals reaching the front door (or the closed loop's clients sending), the pipeline deciding
    (:meth:`poke`), stage executions launched and completed, and at the end the result collected."""

    def __init__(self, pipeline: Any, arrivals_ms, seq_lens, options: SimOptions | None = None,
                 env: simpy.Environment | None = None, external: bool = False) -> None:
        """``env``: the environment to run in (a cluster's replicas share one); ``external``: the queries come
        from outside (a router's :meth:`accept`), not from the arrivals, which then only size the records."""
        o = SimOptions() if options is None else options
        self.options = o
        self.external = external
        self.t0 = time.perf_counter()
        self.pipeline = pipeline
        self.env = simpy.Environment() if env is None else env
        self.on_left: Callable[[list[Query]], None] | None = None  # told of every query that leaves (a router)
        self.device = Device(self.env, o.sharing, o.corun_slowdown, o.cores, corun_per_worker=o.corun_per_worker,
                             contention=o.contention, contention_share=o.contention_share)
        if o.batch_costs is not None and o.host is None:
            raise ValueError("o.batch_costs need a o.host model")
        self.host, self.batch_costs, self.launch_overhead_ms = o.host, o.batch_costs, o.launch_overhead_ms
        self.stalls = False  # o.host stalls drawn at launches
        if o.host is not None:
            self._build_host(o.seed)
        self.jittered = o.service_cv > 0
        if self.jittered:
            self._build_jitter(o.service_cv, o.seed)
        self._build_inputs(arrivals_ms, seq_lens, o.admission_delay_ms, o.seed)
        self._build_transfer(o.transfer, o.batch_costs)
        self.closed_clients, self.think_ms = o.closed_clients, o.think_ms
        if o.closed_clients is not None:
            if o.closed_clients < 1:
                raise ValueError("closed_clients must be >= 1")
        elif self.n_total and np.any(self.arrivals[1:] < self.arrivals[:-1]):
            raise ValueError("arrivals_ms must be sorted (non-decreasing)")
        self._build_records(o.records, o.keep_queries)
        self.progress, self.until_ms, self.fail_soft = o.progress, o.until_ms, o.fail_soft
        self.watchdog_events, self.stop = o.watchdog_events, o.stop
        self.bar: Any = None  # the progress bar, while running with ``progress``
        self.n_stages: int = pipeline.n_stages
        self.n_exec: int = self.n_stages * pipeline.instances  # one executor of every stage of every instance
        self.mailbox: list = [None] * self.n_exec
        self.timer_at = math.inf  # when the front door's armed timer fires (inf: none armed)
        self.groups = None if external else _groups(self.arrivals, self.front_door_times,
                                                    after=self._through_pool if self.pool else None)
        self.due_group: Any = None  # the group of arrivals an armed timeout brings to the front door
        self._next_arrivals_cb = self.next_arrivals  # (the bound method each group's timeout calls, made once)
        if o.host is None:
            self._build_direct_executors()
        else:
            self._build_host_executors()

    # ---------------------------------------------------------------- building the run
    def _build_host(self, seed: int) -> None:
        """The host model's resources: its launching cores, its interpreter lock and, if it stalls, the stalls'
        generator."""
        host, env, pipeline = self.host, self.env, self.pipeline
        self.host_cores = Device(env, "cores", 1.0, host.cores)
        self.cores_to_spare = host.cores >= pipeline.n_stages * pipeline.instances
        self.interpreter_lock = Device(env, "cores", 1.0, 1)  # one lock: processor sharing of capacity one
        if host.stall_prob > 0 or host.stall_cluster_prob:
            self.stalls = True
            self.rng_stall = np.random.default_rng(self._seed(seed, 2))
            self.stall_levels = np.linspace(0.0, 1.0, len(host.stall_ms))
            self.stall_q = np.asarray(host.stall_ms, dtype=float)
            self.last_stall = -math.inf
            self.p_burst = host.stall_prob if host.stall_cluster_prob is None else host.stall_cluster_prob

    def _seed(self, seed: int, *tail: int):
        """The seed of one random stream; a cluster's replica beyond the first (``stream > 0``) has its own."""
        stream = self.options.stream
        if not stream:
            return [seed, *tail] if tail else seed
        return [seed, *tail, 1000 + stream] if tail else [seed, 1000 + stream]

    def _draw_stall(self) -> float:
        """A launch's host stall: one draw pair per launch, in launch order (deterministic per seed)."""
        host, now = self.host, self.env.now
        u, v = self.rng_stall.random(2)
        in_burst = now - self.last_stall < host.stall_window_ms
        if u >= (self.p_burst if in_burst else host.stall_prob):
            return 0.0
        if not in_burst:  # a stall outside a burst starts one (stalls inside it do not prolong it)
            self.last_stall = now
        return float(np.interp(v, self.stall_levels, self.stall_q))

    def _build_jitter(self, service_cv: float, seed: int) -> None:
        self.sigma = math.sqrt(math.log1p(service_cv * service_cv))
        self.rng = np.random.default_rng(self._seed(seed))

    def _draw_jitter(self) -> float:
        """An execution's time factor: log-normal of mean 1 and coefficient of variation ``service_cv``."""
        sigma = self.sigma
        return float(self.rng.lognormal(-sigma * sigma / 2.0, sigma))

    def _build_inputs(self, arrivals_ms, seq_lens, admission_delay_ms, seed: int) -> None:
        """The arrivals and lengths as arrays, and the admission delay's distribution (when it is one)."""
        self.arrivals = np.asarray(arrivals_ms, dtype=np.float64)
        self.lens = np.asarray(seq_lens)
        if self.arrivals.ndim != 1 or self.lens.ndim != 1 or len(self.arrivals) != len(self.lens):
            raise ValueError("arrivals_ms and seq_lens must have the same length")
        self.n_total = len(self.arrivals)
        self.admission_delay_ms = admission_delay_ms
        self.admit_quantiles = None
        if isinstance(admission_delay_ms, (list, tuple)):
            self.admit_levels = np.linspace(0.0, 1.0, len(admission_delay_ms))
            self.admit_quantiles = np.asarray(admission_delay_ms, dtype=float)
            self.rng_admit = np.random.default_rng(self._seed(seed, 1))
            self.last_seen = -math.inf

    def _build_transfer(self, transfer, batch_costs) -> None:
        """The host-to-device link (one copy at a time) when inputs' copies are modelled."""
        self.transfer = transfer
        self.link = None
        modelled = transfer is not None and transfer.mode != "none"
        if modelled or batch_costs is not None:
            from dvasim.server.transfer import PoolLink

            self.link = PoolLink()  # one host-to-device link: copies one at a time
        self.pool = modelled and transfer.mode == "pool"
        self.copy_on_launch = modelled and transfer.mode != "pool"

    def _build_records(self, records: RecordStore | None, keep_queries: bool) -> None:
        if records is None:
            records = RecordStore(self.n_total, self.pipeline.n_stages,
                                  arrivals=None if self.closed_clients is not None else self.arrivals)
        self.records = records
        self.kept: list[Query] | None = [] if keep_queries else None
        # queries created and not yet left (the record of the others is in `records`)
        self.live: dict[int, Query] = {}
        self.created = 0  # queries are made in id order, as they reach the pipeline
        # a completion thread's work after the last stage: the answers leave this much later
        self.answer_delay = 0.0
        self.pipeline.exit_hook = self.on_exit

    # ---------------------------------------------------------------- the front door
    def front_door_times(self, times: np.ndarray, carry: bool = False) -> np.ndarray:
        """When the front door sees queries arriving at ``times``: after the admission delay. For a distribution,
        one receiving thread: in arrival order, each no earlier than the one before it -- with ``carry``, also no
        earlier than the last of the previous call (the open loop's arrivals, read in blocks: the draws are the
        same, block by block or at once)."""
        if self.admit_quantiles is None:
            return times + self.admission_delay_ms
        seen = np.maximum.accumulate(np.append(self.last_seen if carry else -math.inf,
                                               times + np.interp(self.rng_admit.random(len(times)),
                                                                 self.admit_levels, self.admit_quantiles)))[1:]
        if carry and len(seen):
            self.last_seen = seen[-1]
        return seen

    def _through_pool(self, first: int, doors: np.ndarray) -> np.ndarray:
        """Queries ``first..`` reaching the front door at ``doors`` are visible when their copies are done."""
        return self._pool_visible(doors, self.lens[first:first + len(doors)])

    def _pool_visible(self, doors: np.ndarray, lengths) -> np.ndarray:
        # queries of these lengths reach the front door at ``doors``: visible when their copies are done
        link, transfer = self.link, self.transfer
        return np.array([link.visible(t, transfer.query_ms(int(L))) for t, L in zip(doors.tolist(), lengths)])

    def _launch_copy_ms(self, ex) -> float:
        # the batch's copy (a padding policy's dummy rows too), queued on the link: the time until done
        now = self.env.now
        return self.link.visible(now, self.transfer.batch_ms(ex.charged_batch_size, ex.seq_len)) - now

    def make_query(self, k: int, arrival: float) -> Query:
        """Query ``k``, reaching the pipeline now (the closed loop's; the open loop's are made by group)."""
        self.created += 1
        q = Query(k, arrival, int(self.lens[k]))
        self.live[k] = q
        if self.kept is not None:
            self.kept.append(q)
        return q

    def on_exit(self, exited: list[Query]) -> None:
        """The pipeline's exit hook: queries leave (after any completion-thread work) and are recorded."""
        d = self.answer_delay
        live = self.live
        for q in exited:
            del live[q.qid]
            if d:
                q.finish += d
        self.records.add_many(exited)
        if self.bar is not None:  # served or refused (a queue policy's), every query that leaves counts
            self.bar.update(len(exited))
        if self.on_left is not None:
            self.on_left(exited)

    def accept(self, queries: list[Query]) -> None:
        """Queries a router hands this replica now (``external``): its front door sees them after its own
        admission delay (and, with a memory pool, their copies), those seen at the same time together."""
        now = self.env.now
        if self.admission_delay_ms == 0 and self.admit_quantiles is None and not self.pool:
            self._see(queries)
            return
        door = self.front_door_times(np.full(len(queries), now), carry=True)
        if self.pool:
            door = self._pool_visible(door, [q.seq_len for q in queries])
        i, times = 0, door.tolist()
        while i < len(queries):
            j = i
            while j < len(queries) and times[j] == times[i]:
                j += 1
            group = queries[i:j]
            if times[i] > now:
                self.env.timeout(times[i] - now).callbacks.append(partial(self._see, group))
            else:
                self._see(group)
            i = j

    def _see(self, queries: list[Query], _ev=None) -> None:
        live, kept = self.live, self.kept
        self.created += len(queries)
        for q in queries:
            live[q.qid] = q
        if kept is not None:
            kept.extend(queries)
        self.pipeline.arrive_many(queries, self.env._now)
        self.poke()

    def poke(self, self_k: int = -1) -> None:
        """Let the pipeline start what it can. The executor that has just finished (``self_k``) goes on first with
        its next execution, if it has one, then the others start theirs, in the pipeline's order (with a host model,
        once the finished one's next launch sequence has started, :meth:`_host_woken`)."""
        now = self.env._now
        mailbox, n_stages, wake_later = self.mailbox, self.n_stages, self.wake_later
        started: list[Execution] = self.pipeline.step(now)
        if started:
            others = []
            for ex in started:
                k = ex.lane * n_stages + ex.stage
                mailbox[k] = ex
                if k != self_k:
                    others.append(k)
                elif self.host is None:
                    self._start(k)
            for k in others:
                wake_later(k)
        t: float = self.pipeline.wakeup_time()
        if now < t < self.timer_at:
            self.timer_at = t
            # armed by an urgent event of its own at this instant (as a process starting would be): after what this
            # handler schedules (the next arrivals: an arrival at the deadline comes first)
            self._fire(partial(self._arm_timer, t), _URGENT)
        if self.host is None:
            self.device.settle()
        elif self_k < 0:
            self._host_woken()
            self.device.settle()

    def _fire(self, callback, priority=simpy.events.NORMAL, delay: float = 0.0) -> None:
        """An event due in ``delay`` (now by default) whose only effect is ``callback``. The arrivals and the front
        door's timer are urgent: at an instant where they meet a finish, they come first (the order they had when
        a finish reached its handler through an event of its own)."""
        env = self.env
        ev = _EVENT(env)
        ev._ok = True
        ev._value = None
        ev.callbacks.append(callback)
        env.schedule(ev, priority, delay)

    def _arm_timer(self, t: float, _ev) -> None:
        self._fire(partial(self._front_door_fired, t), _URGENT, t - self.env._now)

    def _front_door_fired(self, t: float, _ev) -> None:
        if self.timer_at == t:
            self.timer_at = math.inf
        self.poke()

    # ---------------------------------------------------------------- open loop
    def next_arrivals(self, _ev=None) -> None:
        """Queries seen at the same time reach the front door together, before it decides; then the next group
        is awaited (callbacks of a chain of timeouts: the events, and their order, of a process doing the same).
        Called when the arrivals start, then by each awaited group's timeout (``due_group``, arriving first)."""
        env, groups = self.env, self.groups
        group = self.due_group
        if group is not None:
            self.due_group = None
            self._arrive(group)
        for group in groups:
            t = group[0]
            now = env._now
            if t > now:
                self.due_group = group
                self._fire(self._next_arrivals_cb, _URGENT, t - now)
                return
            self._arrive(group)

    def _arrive(self, group) -> None:
        """A group of queries reaches the front door: they are made and the pipeline decides."""
        _t, first, times = group
        lens = self.lens
        self._see([Query(first + i, a, int(lens[first + i])) for i, a in enumerate(times)])

    # ---------------------------------------------------------------- closed loop
    def closed_clients_send(self, n: int, delay: float):
        """``n`` clients whose answers came back together each send their next query (a process): each reaches the
        front door after its own admission delay, those seen at the same time together."""
        env = self.env
        if delay > 0:
            yield env.timeout(delay)
        sent = []
        for _ in range(n):
            if self.created < self.n_total:
                sent.append(self.make_query(self.created, env.now))
        if not sent:
            self.poke()
            return
        door = self.front_door_times(np.full(len(sent), env.now))
        if self.pool:
            door = self._pool_visible(door, [q.seq_len for q in sent])
        # each client's query reaches the front door at its own time (those seen at the same time together): with a
        # distribution of the admission delay (a real server's client path) the clients do not arrive as one batch
        order = np.argsort(door, kind="stable")
        i = 0
        while i < len(order):
            t = float(door[order[i]])
            if t > env.now:
                yield env.timeout(t - env.now)
            while i < len(order) and float(door[order[i]]) <= t:
                self.pipeline.arrive(sent[int(order[i])], env.now)
                i += 1
            self.poke()

    # ---------------------------------------------------------------- stage executions
    def after_finish(self, ex) -> None:
        """A stage execution is done: the pipeline moves its queries on; those that left, in a closed loop, bring
        their clients' next queries (they update the progress bar as they leave, :meth:`on_exit`)."""
        pipeline = self.pipeline
        n_before = pipeline.n_exited
        pipeline.finish(ex, self.env._now)
        n_exited = pipeline.n_exited - n_before
        if n_exited:
            if self.closed_clients is not None:  # the answers reach the clients after any completion-thread work
                self.env.process(self.closed_clients_send(n_exited, self.think_ms + self.answer_delay))

    # ---- without a host model: callbacks of events, per executor ``k``
    def _build_direct_executors(self) -> None:
        """Executors without a host model. An executor is ready once its start-up (an urgent event at time 0, as
        a process's) has been processed; an execution handed to it before then starts at its start-up."""
        self.on_device = self.device.hosts_launch_work
        self.extra = self.launch_overhead_ms if self.on_device else 0.0  # launch work done on the device
        # host-side work before the device: the launch overhead (unless the device does it)
        self.pre_launch = self.launch_overhead_ms if not self.on_device else 0.0
        self.ready = [False] * self.n_exec
        self.finished_cbs = [partial(self._finished, k) for k in range(self.n_exec)]
        self.wake_later = self._wake_direct

    def _wake_direct(self, k: int) -> None:
        """An execution handed to executor ``k`` starts now (once the executor has started up)."""
        if self.ready[k]:
            self._start(k)

    def _startup(self, k: int, _ev) -> None:
        self.ready[k] = True
        if self.mailbox[k] is not None:
            self._start(k)
            self.device.settle()

    def _start(self, k: int) -> None:
        """Executor ``k`` launches the execution in its mailbox: host-side work first (the launch overhead, and
        for a batch's first stage under [engine.transfer] on_launch its input copy), then the device's."""
        ex = self.mailbox[k]
        pre = self.pre_launch
        if self.copy_on_launch and ex.stage == 0:
            pre += self._launch_copy_ms(ex)
        if pre > 0:
            self.env.timeout(pre).callbacks.append(partial(self._launch_after, k, ex))
        else:
            self._run_on_device(k, ex)

    def _launch_after(self, k: int, ex, _ev) -> None:
        """The host-side work before a launch is done: the execution goes to the device."""
        self._run_on_device(k, ex)
        self.device.settle()

    def _run_on_device(self, k: int, ex: Execution) -> None:
        work = ex.standalone_ms * (self._draw_jitter() if self.jittered else 1.0)
        self.device.start(work + self.extra, ex.demand, self.finished_cbs[k])

    def _finished(self, k: int) -> None:
        """The device is done with executor ``k``'s execution (called by the device, which plans what starts)."""
        mailbox = self.mailbox
        ex = mailbox[k]
        mailbox[k] = None
        self.after_finish(ex)
        self.poke(k)

    # ---- with a host model: each execution's launch sequence, driven by the events it waits for
    def _build_host_executors(self) -> None:
        """Executors with a host model: each execution's launch sequence (:meth:`_host_launch`, a generator of
        the events it waits for) is driven by those events' callbacks (:meth:`_host_drive`), not by a SimPy
        process: an execution handed to an idle executor starts at once, and the GPU's finish resumes its
        sequence directly (no event between them)."""
        self.ready = [False] * self.n_exec
        self.busy = [False] * self.n_exec
        self.woken: list[int] = []  # executors handed an execution while the one that finished goes on first
        self.wake_later = self._wake_host
        # the host's costs of a launch and of a batch's entry and exit, by what they depend on (computed once:
        # the host model and the stack's costs do not change during a run)
        self.launch_costs: dict[tuple[int, int, int], tuple[float, float, float, float, float]] = {}
        self.batch_costs_of: dict[tuple[int, int], tuple[float, float, float]] = {}

    def _launch_costs(self, ex, b: int) -> tuple[float, float, float, float, float]:
        """Execution ``ex``'s (charged ``b`` rows) host costs before its jitter: the Python-level work holding
        the lock, the copies' per-row part (on a core, without the lock), the GPU's time and demand, the launch."""
        key = (ex.stage, b, ex.seq_len)
        got = self.launch_costs.get(key)
        if got is None:
            host = self.host
            g, demand = host.gpu(ex)
            got = self.launch_costs[key] = (host.locked(ex.stage, b), host.copy_rows(ex.stage, b), g, demand,
                                            host.launch(ex.stage, b, ex.seq_len))
        return got

    def _batch_costs(self, b: int, seq_len: int) -> tuple[float, float, float]:
        """A batch's (``b`` rows padded to ``seq_len``) entry on the host, its inputs' copy and its exit."""
        key = (b, seq_len)
        got = self.batch_costs_of.get(key)
        if got is None:
            c = self.batch_costs
            got = self.batch_costs_of[key] = (c.entry_host_ms(b, seq_len), c.h2d_ms(b, seq_len), c.exit_ms(b))
        return got

    def _wake_host(self, k: int) -> None:
        self.woken.append(k)

    def _host_startup(self, k: int, _ev) -> None:
        """Executor ``k`` is ready (an urgent event at time 0, as a process's start)."""
        self.ready[k] = True
        self._host_next(k)
        self.device.settle()

    def _host_next(self, k: int) -> None:
        """Executor ``k`` takes the execution in its mailbox, if it is ready, idle and has one."""
        ex = self.mailbox[k]
        if ex is None or self.busy[k] or not self.ready[k]:
            return
        self.mailbox[k] = None
        self.busy[k] = True
        self._host_drive(k, ex, self._host_launch(ex))

    def _host_woken(self) -> None:
        """The executors handed an execution by the last decision take it, in the pipeline's order."""
        woken = self.woken
        while woken:
            self._host_next(woken.pop(0))

    def _host_drive(self, k: int, ex, seq, _ev=None) -> None:
        """Run execution ``ex``'s launch sequence ``seq`` on until it waits for an event that has not happened
        (its callback resumes it) or ends: then the pipeline moves on and executor ``k`` takes its next one."""
        for ev in seq:
            if isinstance(ev, _GpuWork):
                if ev.done:
                    continue
                ev.waiter = partial(self._host_drive, k, ex, seq)
            elif ev.callbacks is None:  # already processed: go on at once (as a process does)
                continue
            else:
                ev.callbacks.append(partial(self._host_drive, k, ex, seq))
            self.device.settle()
            return
        self.after_finish(ex)
        self.answer_delay = 0.0
        self.busy[k] = False
        self.poke(k)
        self._host_next(k)
        self._host_woken()
        self.device.settle()

    def _host_launch(self, ex):
        """Hand-off and Python-level copies (holding the lock), the copies' per-row part (on a core), then the
        launch on a core while the GPU works;
        with per-batch costs the batch's entry at its first stage and its exit after its last."""
        env, host, batch_costs, lock = self.env, self.host, self.batch_costs, self.interpreter_lock
        if self.copy_on_launch and ex.stage == 0:  # first the batch's input copy ([engine.transfer])
            copy = self._launch_copy_ms(ex)
            if copy > 0:
                yield env.timeout(copy)
        f = self._draw_jitter() if self.jittered else 1.0
        b = ex.charged_batch_size  # a padding policy's dummy rows are copied and launched too
        locked, rows, g, demand, launch = self._launch_costs(ex, b)
        locked = locked * f + self.launch_overhead_ms
        if locked > 0:
            yield lock.run(locked)
        if rows > 0:  # the copies' per-row part: torch's copy releases the lock (HostModel.copy_rows)
            yield env.timeout(rows * f) if self.cores_to_spare else self.host_cores.run(rows * f)
        entry = batch_costs is not None and ex.stage == 0  # the requests' handling, the inputs' gathering, copy
        if entry and batch_costs.idle_between_batches:  # before the GPU starts: it idles for this instance
            yield from self._batch_entry(ex, b)
        gpu = _GpuWork(self.device, g * f, demand)
        if entry and not batch_costs.idle_between_batches:  # asynchronous copies: beside the GPU's work
            yield from self._batch_entry(ex, b)
        launch = launch * f + (self._draw_stall() if self.stalls else 0.0)
        if launch > 0:
            if host.locks_launch:
                yield lock.run(launch)
            elif self.cores_to_spare:  # never more launches at once than cores: none waits for a core
                yield env.timeout(launch)
            else:
                yield self.host_cores.run(launch)
        yield gpu
        if batch_costs is not None and ex.stage == self.n_stages - 1:  # synchronise and copy the outputs back
            post = self._batch_costs(b, ex.seq_len)[2]
            if batch_costs.idle_between_batches:
                if post > 0:
                    yield env.timeout(post)
            else:
                self.answer_delay = post

    def _batch_entry(self, ex, b: int):
        """A batch's entry: the requests' handling and the inputs' gathering, then their copy on the link."""
        env, batch_costs = self.env, self.batch_costs
        pre, h2d, _ = self._batch_costs(b, ex.seq_len)
        if pre > 0:
            yield (self.interpreter_lock.run(pre) if batch_costs.python_level else env.timeout(pre))
        if h2d > 0:
            yield env.timeout(self.link.visible(env.now, h2d) - env.now)

    # ---------------------------------------------------------------- running
    def run(self) -> SimResult:
        """Run to the end (or ``until_ms``, an interrupt, or with ``fail_soft`` an error) and collect the result.
        If the run ends with an error its streamed records are discarded (no half-written file is left)."""
        self.bar = open_bar(self.n_total, self.progress)
        try:
            failure, interrupted = self._run_loop()
            return self._collect(failure, interrupted)
        except BaseException:
            self.records.discard()
            raise

    def _run_loop(self) -> tuple[str | None, str | None]:
        """The events, until the end or what stopped them: ``(failure, interrupted)`` (``None`` where none)."""
        self._start_processes()
        try:
            return drive(self.env, self.pipeline, self.until_ms, self.watchdog_events, self.stop, self.fail_soft)
        finally:
            if self.bar is not None:
                self.bar.close()

    def _start_processes(self) -> None:
        """The arrivals (or the closed loop's clients), then every executor's start-up, at time 0."""
        env = self.env
        if self.external:
            pass  # a router hands the queries in (see :meth:`accept`)
        elif self.closed_clients is None:
            self._fire(self.next_arrivals, _URGENT)  # where the arrivals process would start
        else:
            env.process(self.closed_clients_send(self.closed_clients, 0.0))
        self.start_executors()

    def start_executors(self) -> None:
        """Every executor's start-up, at time 0."""
        for k in range(self.n_exec):
            self._fire(partial(self._startup if self.host is None else self._host_startup, k), _URGENT)

    def _collect(self, failure: str | None, interrupted: str | None = None) -> SimResult:
        """Every query's record: those still inside the pipeline, then those that never reached it (of an
        interrupted run, only those that had arrived); ``stuck`` says why the run stopped early, or which queries
        never finished."""
        pipeline, records, live, n_total = self.pipeline, self.records, self.live, self.n_total
        stuck = failure
        n_done = pipeline.n_exited
        inside = sorted(live)
        records.add_many([live[k] for k in inside])
        n_arrived = n_total if interrupted is None else self._n_arrived()
        for k in range(self.created, n_arrived):
            records.add_unseen(k, int(self.lens[k]))
        if n_arrived < n_total:
            stuck = (f"{failure}; {n_total - n_arrived:,} of {n_total:,} queries had not arrived (left out of the "
                     "records and the metrics)")
            records.leave_out(n_arrived, stuck)
        records.close()
        if failure is None and n_done < n_total:
            first = (inside + list(range(self.created, min(n_total, self.created + 10))))[:10]
            stuck = (f"{n_total - n_done} of {n_total} queries never finished (first ids {first}); "
                     + pipeline.stuck_report())
        return SimResult(self.kept, pipeline, self.env.now, time.perf_counter() - self.t0, self.device.busy_time,
                         stuck, records, interrupted, n_total - n_arrived)

    def _n_arrived(self) -> int:
        """How many queries had arrived by now (ids are in arrival order): those made, and of an open loop also
        those whose arrival has come but that the front door has not seen yet (an admission delay, a copy)."""
        if self.closed_clients is not None:
            return self.created
        return max(self.created, int(np.searchsorted(self.arrivals, self.env.now, side="right")))


class _GpuWork:
    """An execution's GPU work on the device, which a launch sequence waits for (``yield``): ``done`` once the
    device has finished it, and then the sequence waiting for it (``waiter``) is resumed at once."""

    __slots__ = ("done", "waiter")

    def __init__(self, device: Device, work_ms: float, demand: float) -> None:
        self.done = False
        self.waiter: Any = None
        device.start(work_ms, demand, self._finished)

    def _finished(self) -> None:
        self.done = True
        if self.waiter is not None:
            self.waiter()


def open_bar(n_total: int, enabled: bool):
    """The run's progress bar (a terminal gets it: rate, time left; a log does not), or None."""
    bar = progress_bar(n_total, enabled=enabled, unit="q", unit_scale=True, desc="simulating", leave=False,
                       smoothing=0.1)
    return None if isinstance(bar, NoBar) else bar


def drive(env: simpy.Environment, report, until_ms: float | None, watchdog_events: int,
          stop: Callable[[], str | None] | None, fail_soft: bool) -> tuple[str | None, str | None]:
    """Run the events until the end (or ``until_ms``), an interrupt (a stop request, Ctrl-C) or, with
    ``fail_soft``, an error: ``(failure, interrupted)``, ``None`` where none. A full disk is always raised.
    ``report``: what the watchdog names when the clock stops (its ``stuck_report()``)."""
    failure = interrupted = None
    try:
        with spaced_collections():  # (the garbage collector's young collections find nothing in a run)
            if until_ms is None:
                _run_watched(env, report, watchdog_events, stop)
            else:
                env.run(until=until_ms)
    except StopRequested as e:
        interrupted = str(e)
    except KeyboardInterrupt:  # Ctrl-C in Python (or a signal handler that raises: it named it in ``stop``)
        interrupted = (stop() if stop is not None else None) or "Ctrl-C"
    except OutputError:  # a full disk is the user's to fix, never a soft failure
        raise
    except Exception as e:  # keep every record collected so far; the caller reports the failure
        if not fail_soft:
            raise
        failure = f"{type(e).__name__} at simulated time {env.now:.3f} ms: {e}"
    if interrupted is not None:
        failure = f"interrupted by {interrupted} at simulated time {env.now:.3f} ms"
    return failure, interrupted


def _groups(arrivals, front_door_times, block: int = 1 << 16, after=None):
    """``(t, first, arrivals)`` for each run of queries the front door sees at the same time ``t``, in order:
    the id of the first and the arrival times of all; the times are computed from ``arrivals`` a block at a time
    (memory stays small whatever the run's length). ``after(first, times)``: the times the front door really
    sees queries ``first..`` that reach it at ``times`` (the memory pool's copies)."""
    n = len(arrivals)
    t_run, first, run = None, 0, []  # type: Any, int, list[float]
    for b in range(0, n, block):
        seen = front_door_times(arrivals[b:b + block], carry=True)
        if after is not None:
            seen = after(b, seen)
        for j, (t, a) in enumerate(zip(seen.tolist(), arrivals[b:b + block].tolist()), start=b):
            if t != t_run:
                if run:
                    yield t_run, first, run
                t_run, first, run = t, j, []
            run.append(a)
    if run:
        yield t_run, first, run
