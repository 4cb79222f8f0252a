"""The replay backend: the simulator's control plane (same pipeline, mechanism and policy objects) driving real
torch execution of the model zoo's stage modules, on the CPU (threads) or on CUDA (streams and events).

>>> from dvasim.engines.replay import replay
>>> result = replay("experiments/validation/configs/resnet152_zerobatch_low.toml")   # doctest: +SKIP

See :mod:`dvasim.engines.replay.engine` (threads, CUDA discipline, timing), :mod:`dvasim.model.stages.buffers` (real buffers),
:mod:`dvasim.engines.replay.loadgen` (MLPerf LoadGen Server scenario) and :mod:`dvasim.fitting.validate` (fidelity).
Needs torch (the ``replay`` extra).
"""

from dvasim.engines.replay.engine import (
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
