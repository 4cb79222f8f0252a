"""The replay backend: the simulator's control plane (same pipeline, mechanism and policy objects) driving real
torch execution of the model zoo's stage modules, on the CPU (threads) or on CUDA (streams and events).

>>> from dvasim.engines.replay import replay
>>> result = replay("experiments/validation/configs/resnet152_zerobatch_low.toml")   # doctest: +SKIP

See :mod:`dvasim.engines.replay.engine` (threads, CUDA discipline, timing), :mod:`dvasim.model.stages` (the
stage modules, real buffers, CUDA graphs) and :mod:`dvasim.engines.replay.loadgen` (MLPerf LoadGen's Server
scenario); the simulator-vs-replay check is :mod:`dvasim.fitting.validate`. Needs torch (the ``replay`` extra).

May import: torch, the MLPerf LoadGen, and the layers below the engines (model data's stage runners included).
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
