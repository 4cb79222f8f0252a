"""The SimPy engine: one process per stage executor, one for arrivals, one for the front door's timer.

The control state (batch table, batch queues, buffer pairs, executor states, policy) lives in
:class:`dvasim.core.pipeline.Pipeline`; this module only adds time: arrivals at their instants, stage executions
that take the time the :class:`~dvasim.engines.sim.device.Device` gives them, and the policy's wake-ups.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import simpy

from dvasim.core.pipeline import Pipeline
from dvasim.core.query import Query
from dvasim.engines.sim.device import Device
from dvasim.reporting.records import RecordStore


class DeadlockError(RuntimeError):
    """The simulation ran out of events while queries were still inside the pipeline."""


@dataclass
class SimResult:
    queries: list[Query] | None  # the Query objects, in id order (``keep_queries``), else None
    pipeline: Pipeline
    sim_end_ms: float
    wall_s: float
    device_busy_ms: float
    stuck: str | None = None  # description of the pipeline if some queries never finished
    records: RecordStore | None = None  # every query's record (columnar), finished or not


class SimulationStuck(RuntimeError):
    """The simulated clock stopped advancing (see :func:`simulate`'s watchdog)."""


def _run_watched(env: simpy.Environment, pipeline: Pipeline, limit: int) -> None:
    """``env.run()``, stopping with :class:`SimulationStuck` when ``limit`` events in a row leave the clock where
    it was. (The clock is read from the environment's own attribute: this loop runs once per event.)"""
    step = env.step
    t_prev, same = env.now, 0
    try:
        while True:
            step()
            if env._now != t_prev:
                t_prev, same = env._now, 0
                continue
            same += 1
            if same > limit:
                raise SimulationStuck(f"no progress in simulated time for {limit:,} events at {env.now:.6f} ms; "
                                      + pipeline.stuck_report())
    except simpy.core.EmptySchedule:
        return


def simulate(
    pipeline: Pipeline,
    arrivals_ms,
    seq_lens,
    *,
    sharing: str = "fluid",
    corun_slowdown: float = 1.0,
    launch_overhead_ms: float = 0.0,
    admission_delay_ms: float | list[float] = 0.0,
    service_cv: float = 0.0,
    seed: int = 0,
    progress: bool = False,
    until_ms: float | None = None,
    closed_clients: int | None = None,
    think_ms: float = 0.0,
    fail_soft: bool = False,
    cores: int = 2,
    host=None,
    watchdog_events: int = 1_000_000,
    records: RecordStore | None = None,
    keep_queries: bool = True,
    transfer=None,
    batch_costs=None,
    corun_per_worker: float = 0.0,
) -> SimResult:
    """Run ``pipeline`` on the given arrivals. Every query is in the result, finished or not.

    With ``closed_clients = c`` the load is a closed loop instead: ``c`` clients each send a query, wait for its
    answer, think for ``think_ms`` and send the next, until all ``len(seq_lens)`` queries are sent (the given
    arrival times are then ignored and replaced by the times the queries were sent).

    An interrupt (Ctrl-C) stops the run and returns what was collected; with ``fail_soft`` so does any error
    (the result's ``stuck`` says what happened). A watchdog stops a run whose clock has not advanced for
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
    ``corun_per_worker = k`` slows every execution by ``1 + k * (n - 1)`` while ``n`` run at once."""
    t0 = time.perf_counter()
    env = simpy.Environment()
    device = Device(env, sharing, corun_slowdown, cores, corun_per_worker=corun_per_worker)
    if batch_costs is not None and host is None:
        raise ValueError("batch_costs need a host model")
    if host is not None:
        host_cores = Device(env, "cores", 1.0, host.cores)
        cores_to_spare = host.cores >= pipeline.n_stages * pipeline.instances
        interpreter_lock = Device(env, "cores", 1.0, 1)  # one lock: processor sharing of capacity one
        stall = None
        if host.stall_prob > 0 or host.stall_cluster_prob:
            import numpy as np

            rng_stall = np.random.default_rng([seed, 2])
            stall_levels = np.linspace(0.0, 1.0, len(host.stall_ms))
            stall_q = np.asarray(host.stall_ms, dtype=float)
            last_stall = [-math.inf]
            p_burst = host.stall_prob if host.stall_cluster_prob is None else host.stall_cluster_prob

            def stall() -> float:  # one draw pair per launch, in launch order (deterministic per seed)
                u, v = rng_stall.random(2)
                in_burst = env.now - last_stall[0] < host.stall_window_ms
                if u >= (p_burst if in_burst else host.stall_prob):
                    return 0.0
                if not in_burst:  # a stall outside a burst starts one (stalls inside it do not prolong it)
                    last_stall[0] = env.now
                return float(np.interp(v, stall_levels, stall_q))
    jitter = None
    if service_cv > 0:
        import numpy as np

        sigma = math.sqrt(math.log1p(service_cv * service_cv))
        rng = np.random.default_rng(seed)
        jitter = lambda: float(rng.lognormal(-sigma * sigma / 2.0, sigma))  # noqa: E731
    import numpy as np

    arrivals = np.asarray(arrivals_ms, dtype=np.float64)
    lens = np.asarray(seq_lens)
    if arrivals.ndim != 1 or lens.ndim != 1 or len(arrivals) != len(lens):
        raise ValueError("arrivals_ms and seq_lens must have the same length")
    n_total = len(arrivals)
    if isinstance(admission_delay_ms, (list, tuple)):
        levels = np.linspace(0.0, 1.0, len(admission_delay_ms))
        quantiles = np.asarray(admission_delay_ms, dtype=float)
        rng_admit = np.random.default_rng([seed, 1])

        last_seen = [-math.inf]

        def front_door_times(times: np.ndarray, carry: bool = False) -> np.ndarray:
            # one receiving thread: in arrival order, each no earlier than the one before it -- with ``carry``,
            # also no earlier than the last of the previous call (the open loop's arrivals, read in blocks: the
            # draws are the same, block by block or at once)
            seen = np.maximum.accumulate(np.append(last_seen[0] if carry else -math.inf,
                                                   times + np.interp(rng_admit.random(len(times)), levels,
                                                                     quantiles)))[1:]
            if carry and len(seen):
                last_seen[0] = seen[-1]
            return seen
    else:
        def front_door_times(times: np.ndarray, carry: bool = False) -> np.ndarray:
            return times + admission_delay_ms
    pool = on_launch = None
    link = None
    if (transfer is not None and transfer.mode != "none") or batch_costs is not None:
        from dvasim.server.transfer import PoolLink

        link = PoolLink()  # one host-to-device link: copies one at a time
    if transfer is not None and transfer.mode != "none":
        if transfer.mode == "pool":
            def pool(doors: np.ndarray, lengths) -> np.ndarray:
                # queries of these lengths reach the front door at ``doors``: visible when their copies are done
                return np.array([link.visible(t, transfer.query_ms(int(L))) for t, L in zip(doors.tolist(), lengths)])
        else:
            def on_launch(ex) -> float:
                # the batch's copy (a padding policy's dummy rows too), queued on the link: the time until done
                now = env.now
                return link.visible(now, transfer.batch_ms(ex.charged_batch_size, ex.seq_len)) - now
    if closed_clients is not None:
        if closed_clients < 1:
            raise ValueError("closed_clients must be >= 1")
    elif n_total and np.any(arrivals[1:] < arrivals[:-1]):
        raise ValueError("arrivals_ms must be sorted (non-decreasing)")
    if records is None:
        records = RecordStore(n_total, pipeline.n_stages,
                              arrivals=None if closed_clients is not None else arrivals)
    kept: list[Query] | None = [] if keep_queries else None
    live: dict[int, Query] = {}  # queries created and not yet left (the record of the others is in `records`)

    created = [0]  # queries are made in id order, as they reach the pipeline

    def make_query(k: int, arrival: float) -> Query:
        created[0] += 1
        q = Query(k, arrival, int(lens[k]))
        live[k] = q
        if kept is not None:
            kept.append(q)
        return q

    answer_delay = [0.0]  # a completion thread's work after the last stage: the answers leave this much later

    def on_exit(exited: list[Query]) -> None:
        d = answer_delay[0]
        for q in exited:
            del live[q.qid]
            if d:
                q.finish += d
        records.add_many(exited)

    pipeline.exit_hook = on_exit
    n_stages = pipeline.n_stages
    n_exec = n_stages * pipeline.instances  # one executor of every stage of every instance
    mailbox: list = [None] * n_exec
    timer_at = [math.inf]
    schedule = env.schedule
    URGENT = simpy.events.URGENT

    bar = None
    if progress:
        from tqdm import tqdm

        # a terminal gets the bar (queries per second and the time left); a log file or CI does not
        bar = tqdm(total=n_total, unit="q", unit_scale=True, desc="simulating", leave=False, disable=None,
                   smoothing=0.1)

    def poke(self_k: int = -1) -> None:
        """Let the pipeline start what it can. An execution for another executor starts when its wake-up is
        processed (after what is already due at this instant); one for ``self_k`` (the executor that has just
        finished) is left in its mailbox for the caller to start at once."""
        now = env.now
        for ex in pipeline.step(now):
            k = ex.lane * n_stages + ex.stage
            mailbox[k] = ex
            if k != self_k:
                wake_later(k)
        t = pipeline.wakeup_time()
        if now < t < timer_at[0]:
            timer_at[0] = t
            # the timer is armed by an urgent event of its own at this instant (as a process starting would be)
            _fire(lambda _e: env.timeout(t - env.now).callbacks.append(lambda _e2: front_door_fired(t)), URGENT)

    def _fire(callback, priority=simpy.events.NORMAL) -> None:
        """An event due now whose only effect is ``callback``."""
        ev = simpy.Event(env)
        ev._ok = True
        ev._value = None
        ev.callbacks.append(callback)
        schedule(ev, priority)

    def front_door_fired(t: float) -> None:
        if timer_at[0] == t:
            timer_at[0] = math.inf
        poke()

    # ---------------------------------------------------------------- open loop
    groups = _groups(arrivals, front_door_times,
                     after=None if pool is None else lambda first, seen: pool(seen, lens[first:first + len(seen)]))

    def next_arrivals(_ev=None) -> None:
        """Queries seen at the same time reach the front door together, before it decides; then the next group
        is awaited (callbacks of a chain of timeouts: the events, and their order, of a process doing the same)."""
        while True:
            group = next(groups, None)
            if group is None:
                return
            t, first, times = group
            if t > env.now:
                env.timeout(t - env.now).callbacks.append(lambda _e, g=group: arrive_group(g))
                return
            arrive_group(group, chain=False)

    def arrive_group(group, chain: bool = True) -> None:
        _t, first, times = group
        pipeline.arrive_many([make_query(k, a) for k, a in enumerate(times, start=first)], env.now)
        poke()
        if chain:
            next_arrivals()

    # ---------------------------------------------------------------- closed loop
    def closed_clients_send(n: int, delay: float):
        # ``n`` clients whose answers came back together send their next queries together
        if delay > 0:
            yield env.timeout(delay)
        sent = []
        for _ in range(n):
            if created[0] < n_total:
                sent.append(make_query(created[0], env.now))
        if sent:
            door = front_door_times(np.full(len(sent), env.now))
            if pool is not None:
                door = pool(door, [q.seq_len for q in sent])
            delay = float(door.max()) - env.now
            if delay > 0:
                yield env.timeout(delay)
        for q in sent:
            pipeline.arrive(q, env.now)
        poke()

    # ---------------------------------------------------------------- stage executions
    def after_finish(ex) -> None:
        n_before = pipeline.n_exited
        pipeline.finish(ex, env.now)
        n_exited = pipeline.n_exited - n_before
        if n_exited:
            if bar is not None:
                bar.update(n_exited)
            if closed_clients is not None:  # the answers reach the clients after any completion-thread work
                env.process(closed_clients_send(n_exited, think_ms + answer_delay[0]))

    if host is None:
        on_device = device.hosts_launch_work
        extra = launch_overhead_ms if on_device else 0.0
        # an executor is ready once its start-up (an urgent event at time 0, as a process's) has been processed;
        # an execution handed to it before then starts at its start-up
        ready = [False] * n_exec

        def make_executor(k: int):
            def run_on_device(ex) -> None:
                work = ex.standalone_ms * (jitter() if jitter is not None else 1.0)
                device.run(work + extra, ex.demand).callbacks.append(finished)

            def start(_ev=None) -> None:
                ex = mailbox[k]
                # host-side work before the device: the launch overhead (unless the device does it), and for a
                # batch's first stage under [engine.transfer] on_launch its input copy
                pre = launch_overhead_ms if not on_device else 0.0
                if on_launch is not None and ex.stage == 0:
                    pre += on_launch(ex)
                if pre > 0:
                    env.timeout(pre).callbacks.append(lambda _e: run_on_device(ex))
                else:
                    run_on_device(ex)

            def finished(_ev) -> None:
                ex = mailbox[k]
                mailbox[k] = None
                after_finish(ex)
                poke(k)
                if mailbox[k] is not None:  # this executor goes on at once with its next batch
                    start()

            def startup(_ev) -> None:
                ready[k] = True
                if mailbox[k] is not None:
                    start()

            return start, startup

        executors = [make_executor(k) for k in range(n_exec)]

        def wake_later(k: int) -> None:
            if ready[k]:
                _fire(executors[k][0])
    else:
        wake = [env.event() for _ in range(n_exec)]

        def host_launch(ex):
            # hand-off and Python-level copies (holding the lock), then the launch on a core while the GPU works
            if on_launch is not None and ex.stage == 0:  # first the batch's input copy ([engine.transfer])
                copy = on_launch(ex)
                if copy > 0:
                    yield env.timeout(copy)
            f = jitter() if jitter is not None else 1.0
            b = ex.charged_batch_size  # a padding policy's dummy rows are copied and launched too
            locked = host.locked(ex.stage, b) * f + launch_overhead_ms
            if locked > 0:
                yield interpreter_lock.run(locked)
            entry = batch_costs is not None and ex.stage == 0  # the requests' handling, the inputs' gathering, copy
            if entry and batch_costs.idle_between_batches:  # before the GPU starts: it idles for this instance
                yield from batch_entry(ex, b)
            g, demand = host.gpu(ex)
            gpu = device.run(g * f, demand)
            if entry and not batch_costs.idle_between_batches:  # asynchronous copies: beside the GPU's work
                yield from batch_entry(ex, b)
            launch = host.launch(ex.stage, b, ex.seq_len) * f + (stall() if stall is not None else 0.0)
            if launch > 0:
                if host.locks_launch:
                    yield interpreter_lock.run(launch)
                elif cores_to_spare:  # never more launches at once than cores: none waits for a core
                    yield env.timeout(launch)
                else:
                    yield host_cores.run(launch)
            yield gpu
            if batch_costs is not None and ex.stage == n_stages - 1:  # synchronise and copy the outputs back
                post = batch_costs.exit_ms(b)
                if batch_costs.idle_between_batches:
                    if post > 0:
                        yield env.timeout(post)
                else:
                    answer_delay[0] = post

        def batch_entry(ex, b):
            pre = batch_costs.entry_host_ms(b, ex.seq_len)
            if pre > 0:
                yield (interpreter_lock.run(pre) if batch_costs.python_level else env.timeout(pre))
            h2d = batch_costs.h2d_ms(b, ex.seq_len)
            if h2d > 0:
                yield env.timeout(link.visible(env.now, h2d) - env.now)

        def executor(k: int):
            while True:
                if mailbox[k] is None:
                    yield wake[k]
                ex = mailbox[k]
                mailbox[k] = None
                yield from host_launch(ex)
                after_finish(ex)
                answer_delay[0] = 0.0
                poke(k)

        def wake_later(k: int) -> None:
            ev = wake[k]
            wake[k] = env.event()
            ev.succeed()

    if closed_clients is None:
        _fire(next_arrivals, URGENT)  # where the arrivals process would start
    else:
        env.process(closed_clients_send(closed_clients, 0.0))
    for k in range(n_exec):
        if host is None:
            _fire(executors[k][1], URGENT)
        else:
            env.process(executor(k))
    failure = None
    try:
        if until_ms is None:
            _run_watched(env, pipeline, watchdog_events)
        else:
            env.run(until=until_ms)
    except KeyboardInterrupt:
        failure = f"interrupted at simulated time {env.now:.3f} ms"
    except Exception as e:  # keep every record collected so far; the caller reports the failure
        if not fail_soft:
            raise
        failure = f"{type(e).__name__} at simulated time {env.now:.3f} ms: {e}"
    finally:
        if bar is not None:
            bar.close()
    stuck = failure
    n_done = pipeline.n_exited
    # every query is in the records: those still inside the pipeline, then those that never reached it
    inside = sorted(live)
    records.add_many([live[k] for k in inside])
    for k in range(created[0], n_total):
        records.add_unseen(k, int(lens[k]))
    records.close()
    if failure is None and n_done < n_total:
        first = (inside + list(range(created[0], min(n_total, created[0] + 10))))[:10]
        stuck = (f"{n_total - n_done} of {n_total} queries never finished (first ids {first}); "
                 + pipeline.stuck_report())
    return SimResult(kept, pipeline, env.now, time.perf_counter() - t0, device.busy_time, stuck, records)


def _groups(arrivals, front_door_times, block: int = 1 << 16, after=None):
    """``(t, first, arrivals)`` for each run of queries the front door sees at the same time ``t``, in order:
    the id of the first and the arrival times of all; the times are computed from ``arrivals`` a block at a time
    (memory stays small whatever the run's length). ``after(first, times)``: the times the front door really
    sees queries ``first..`` that reach it at ``times`` (the memory pool's copies)."""
    n = len(arrivals)
    t_run, first, run = None, 0, []
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
