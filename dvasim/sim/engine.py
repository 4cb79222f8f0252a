"""The SimPy engine: one process per stage executor, one for arrivals, one for the front door's timer.

The control state (batch table, batch queues, buffer pairs, executor states, policy) lives in
:class:`dvasim.core.pipeline.Pipeline`; this module only adds time: arrivals at their instants, stage executions
that take the time the :class:`~dvasim.sim.device.Device` gives them, and the policy's wake-ups.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import simpy

from dvasim.core.pipeline import Pipeline
from dvasim.core.query import Query
from dvasim.sim.device import Device


class DeadlockError(RuntimeError):
    """The simulation ran out of events while queries were still inside the pipeline."""


@dataclass
class SimResult:
    queries: list[Query]
    pipeline: Pipeline
    sim_end_ms: float
    wall_s: float
    device_busy_ms: float
    stuck: str | None = None  # description of the pipeline if some queries never finished


class SimulationStuck(RuntimeError):
    """The simulated clock stopped advancing (see :func:`simulate`'s watchdog)."""


def _run_watched(env: simpy.Environment, pipeline: Pipeline, limit: int) -> None:
    """``env.run()``, stopping with :class:`SimulationStuck` when ``limit`` events in a row leave the clock where
    it was."""
    step, peek = env.step, env.peek
    t_prev, same = env.now, 0
    while peek() != math.inf:
        step()
        if env.now != t_prev:
            t_prev, same = env.now, 0
            continue
        same += 1
        if same > limit:
            raise SimulationStuck(f"no progress in simulated time for {limit:,} events at {env.now:.6f} ms; "
                                  + pipeline.stuck_report())


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

    ``host`` (a :class:`dvasim.sim.host.HostModel`, ``[engine.host]``) models the host of a GPU run: every stage
    launch then costs host time on the host's launching cores, its Python-level part holds one interpreter lock,
    and the table's time is the GPU's, run on the device while the kernels are launched (see
    :mod:`dvasim.sim.host`)."""
    t0 = time.perf_counter()
    env = simpy.Environment()
    device = Device(env, sharing, corun_slowdown, cores)
    if host is not None:
        host_cores = Device(env, "cores", 1.0, host.cores)
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
    if isinstance(admission_delay_ms, (list, tuple)):
        import numpy as np

        levels = np.linspace(0.0, 1.0, len(admission_delay_ms))
        quantiles = np.asarray(admission_delay_ms, dtype=float)
        rng_admit = np.random.default_rng([seed, 1])

        def front_door_times(arrivals: list[float]) -> list[float]:
            d = np.interp(rng_admit.random(len(arrivals)), levels, quantiles)
            out, last = [], -math.inf
            for a, x in zip(arrivals, d):
                last = max(last, a + float(x))  # one receiving thread: in arrival order
                out.append(last)
            return out
    else:
        def front_door_times(arrivals: list[float]) -> list[float]:
            return [a + admission_delay_ms for a in arrivals]
    n_stages = pipeline.n_stages
    queries = [Query(i, float(a), int(s)) for i, (a, s) in enumerate(zip(arrivals_ms, seq_lens))]
    if len(queries) != len(arrivals_ms) or len(arrivals_ms) != len(seq_lens):
        raise ValueError("arrivals_ms and seq_lens must have the same length")
    if closed_clients is not None:
        if closed_clients < 1:
            raise ValueError("closed_clients must be >= 1")
        for q in queries:
            q.arrival = math.nan
    elif any(b.arrival < a.arrival for a, b in zip(queries, queries[1:])):
        raise ValueError("arrivals_ms must be sorted (non-decreasing)")
    next_closed = [0]
    n_exec = n_stages * pipeline.instances  # one process per stage executor of every instance
    wake = [env.event() for _ in range(n_exec)]
    mailbox: list = [None] * n_exec
    timer_at = [math.inf]

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(queries), unit="q", desc="simulating", leave=False)

    def poke() -> None:
        now = env.now
        for ex in pipeline.step(now):
            k = ex.lane * n_stages + ex.stage
            mailbox[k] = ex
            ev = wake[k]
            wake[k] = env.event()
            ev.succeed()
        t = pipeline.wakeup_time()
        if now < t < timer_at[0]:
            timer_at[0] = t
            env.process(front_door_timer(t))

    def front_door_timer(t: float):
        yield env.timeout(t - env.now)
        if timer_at[0] == t:
            timer_at[0] = math.inf
        poke()

    def arrivals():
        # queries seen at the same time reach the front door together, before it decides
        k, n = 0, len(queries)
        seen = front_door_times([q.arrival for q in queries])
        while k < n:
            t = seen[k]
            if t > env.now:
                yield env.timeout(t - env.now)
            while k < n and seen[k] == t:
                pipeline.arrive(queries[k], env.now)
                k += 1
            poke()

    def closed_clients_send(n: int, delay: float):
        # ``n`` clients whose answers came back together send their next queries together
        if delay > 0:
            yield env.timeout(delay)
        sent = []
        for _ in range(n):
            if next_closed[0] < len(queries):
                q = queries[next_closed[0]]
                next_closed[0] += 1
                q.arrival = env.now
                sent.append(q)
        delay = max(front_door_times([env.now] * len(sent)), default=env.now) - env.now
        if delay > 0:
            yield env.timeout(delay)
        for q in sent:
            pipeline.arrive(q, env.now)
        poke()

    def host_launch(ex):
        # hand-off and Python-level copies (holding the lock), then the launch on a core while the GPU works
        f = jitter() if jitter is not None else 1.0
        b = ex.batch_size
        locked = host.locked(ex.stage, b) * f + launch_overhead_ms
        if locked > 0:
            yield interpreter_lock.run(locked)
        g, demand = host.gpu(ex)
        gpu = device.run(g * f, demand)
        launch = host.launch(ex.stage, b, ex.seq_len) * f + (stall() if stall is not None else 0.0)
        if launch > 0:
            yield (interpreter_lock if host.locks_launch else host_cores).run(launch)
        yield gpu

    def executor(k: int):
        while True:
            if mailbox[k] is None:
                yield wake[k]
            ex = mailbox[k]
            mailbox[k] = None
            if host is not None:
                yield from host_launch(ex)
            else:
                on_device = device.hosts_launch_work
                if launch_overhead_ms > 0 and not on_device:
                    yield env.timeout(launch_overhead_ms)
                work = ex.standalone_ms * (jitter() if jitter is not None else 1.0)
                yield device.run(work + (launch_overhead_ms if on_device else 0.0), ex.demand)
            n_before = len(pipeline.exited)
            pipeline.finish(ex, env.now)
            n_exited = len(pipeline.exited) - n_before
            if bar is not None and n_exited:
                bar.update(n_exited)
            if closed_clients is not None and n_exited:
                env.process(closed_clients_send(n_exited, think_ms))
            poke()

    if closed_clients is None:
        env.process(arrivals())
    else:
        env.process(closed_clients_send(closed_clients, 0.0))
    for k in range(n_exec):
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
    if failure is None and len(pipeline.exited) < len(queries):
        unfinished = [q.qid for q in queries if not q.done]
        stuck = (
            f"{len(unfinished)} of {len(queries)} queries never finished (first ids {unfinished[:10]}); "
            + pipeline.stuck_report()
        )
    return SimResult(queries, pipeline, env.now, time.perf_counter() - t0, device.busy_time, stuck)
