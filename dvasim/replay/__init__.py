"""The replay backend: the simulator's control plane (same pipeline, mechanism and policy objects) driving real
torch execution of the model zoo's stage modules, on the CPU (threads) or on CUDA (streams and events).

>>> from dvasim.replay import replay
>>> result = replay("experiments/validation/configs/resnet152_zerobatch_low.toml")   # doctest: +SKIP

See :mod:`dvasim.replay.engine` (threads, CUDA discipline, timing), :mod:`dvasim.replay.buffers` (real buffers),
:mod:`dvasim.replay.loadgen` (MLPerf LoadGen Server scenario) and :mod:`dvasim.replay.validate` (fidelity).
Needs torch (the ``replay`` extra).
"""

from dvasim.replay.engine import (
    CudaOps,
    ReplayEngine,
    ReplayError,
    ReplayResult,
    ReplayStageError,
    make_engine,
    overhead_stats,
    prepare,
    replay,
    to_run_result,
)

__all__ = [
    "CudaOps",
    "ReplayEngine",
    "ReplayError",
    "ReplayResult",
    "ReplayStageError",
    "make_engine",
    "overhead_stats",
    "prepare",
    "replay",
    "to_run_result",
]
