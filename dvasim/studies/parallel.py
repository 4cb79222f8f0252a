"""Independent jobs of a study (a capacity search per seed, a plan per policy and seed) on several processes, or
on a Dask cluster.

:func:`map_jobs` runs ``fn(job)`` for every job and returns the results in the jobs' order, whatever order they
finish in: every job is seeded, so the results do not depend on ``workers`` (tested). One worker (or one job) runs
in this process, with ``progress`` called live from inside the job; otherwise the jobs run on a process pool
(``workers`` processes, default one per core) or, with ``dask`` (a scheduler address or a ``distributed.Client``,
as ``dvasim sweep --dask``), on that cluster, and ``progress`` is called in this process with each job's records
once it is done (:func:`map_jobs`' ``records``). Ctrl-C cancels what has not started and raises
:class:`KeyboardInterrupt`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from dvasim.errors import UsageError

__all__ = ["map_jobs", "default_workers", "connect", "worker_leaves_signals", "stop_pool",
           "DASK_CONNECT_TIMEOUT_S"]

DASK_CONNECT_TIMEOUT_S = 5.0  # a scheduler that does not answer by then is reported, not waited for


def default_workers(n_jobs: int) -> int:
    """One process per core, never more than the jobs."""
    return max(1, min(int(n_jobs), os.cpu_count() or 1))


def map_jobs(fn: Callable[[Any, Any], Any], jobs: Sequence[Any], *, workers: int | None = None, dask: Any = None,
             progress: Callable[[dict], None] | None = None,
             records: Callable[[Any], list[dict]] = lambda r: []) -> list[Any]:
    """``[fn(job, progress) for job in jobs]``, on ``workers`` processes (or ``dask``); ``fn`` must be a module-level
    function (it is pickled). ``records(result)``: the records of a finished job to hand to ``progress`` when the
    job ran elsewhere (a job in this process calls ``progress`` itself)."""
    jobs = list(jobs)
    n = default_workers(len(jobs)) if workers is None else max(1, min(int(workers), len(jobs)))
    if dask is None and (n <= 1 or len(jobs) <= 1):
        return [fn(job, progress) for job in jobs]
    if dask is not None:
        client, ours = connect(dask)
        try:
            futures = [client.submit(fn, job, None, pure=False) for job in jobs]
            out = []
            for fut in futures:
                res = fut.result()
                _show(progress, records(res))
                out.append(res)
            return out
        finally:
            if ours:
                client.close()
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    pool = None
    try:
        # the workers leave Ctrl-C to this process, which stops them (a worker that took it would go on to its next
        # job, and the pool's exit would wait for every job)
        pool = ProcessPoolExecutor(max_workers=n, initializer=worker_leaves_signals)
        futures = [pool.submit(fn, job, None) for job in jobs]
        out = []
        for fut in futures:  # in the jobs' order: the printed records too
            res = fut.result()
            _show(progress, records(res))
            out.append(res)
        pool.shutdown()
        return out
    except (KeyboardInterrupt, BrokenProcessPool) as e:
        # Ctrl-C reaches the workers too (one process group): stop them now, not when their jobs end
        stop_pool(pool)
        raise KeyboardInterrupt("interrupted") from (None if isinstance(e, KeyboardInterrupt) else e)
    except BaseException:
        stop_pool(pool)
        raise


def worker_leaves_signals() -> None:
    """A worker's start: Ctrl-C is its parent's to handle, and SIGTERM (the parent's ``terminate()``) ends it at once
    (a handler inherited from ``dvasim``, which raises, let a worker go on to its next job: 15 s more to exit)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def stop_pool(pool) -> None:
    """Cancel what has not started and end the workers at once (a study cut short keeps nothing of them)."""
    if pool is None:
        return
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()


def _show(progress, recs: list[dict]) -> None:
    if progress is not None:
        for r in recs:
            progress(r)


def connect(dask: Any):
    """``(client, ours)``: ``dask`` (a ``distributed.Client``, used as it is) or a scheduler address, connected
    within :data:`DASK_CONNECT_TIMEOUT_S` seconds (``ours``: the client was made here and is closed after the
    sweep); an address that cannot be reached is a one-line :class:`UsageError` on ``--dask``."""
    try:
        from distributed import Client
    except ImportError:  # pragma: no cover  (distributed is a dependency)
        raise UsageError("--dask", "needs the distributed package: pip install distributed") from None
    if isinstance(dask, Client):
        return dask, False
    if not isinstance(dask, str) or not dask.strip():
        raise UsageError("--dask", f"must be a scheduler address such as tcp://HOST:8786 (or, from Python, a "
                                   f"distributed.Client), got {dask!r}")
    try:
        return Client(dask, timeout=DASK_CONNECT_TIMEOUT_S), True
    except Exception as e:  # refused, timed out, a bad address, something else listening there
        why = " ".join(str(e).split())[:200] or type(e).__name__
        raise UsageError("--dask", f"no Dask scheduler answered at {dask!r} within {DASK_CONNECT_TIMEOUT_S:g} s "
                                   f"({why}); start one there (dask scheduler) or check the address") from None
