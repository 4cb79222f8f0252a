"""Model data: what the simulator knows of a model.

* :mod:`~dvasim.model.table` -- per-stage latency tables (stage x batch size x input length) and their provenance;
* :mod:`~dvasim.model.slicing` -- cutting an operator table into stages; :mod:`~dvasim.model.catalog` -- the
  shipped models by name (the ``[model]`` section);
* :mod:`~dvasim.model.gpu_model` -- the analytic GPU model behind the Titan RTX / A100 tables;
* :mod:`~dvasim.model.zoo` -- the real torch models, operator lists cut anywhere;
* :mod:`~dvasim.model.stages` -- running a stage as serving stacks run it (TorchScript, CUDA graphs, buffers);
* :mod:`~dvasim.model.profiling` -- the profiler and the device-sharing measurement.

May import: the foundation, :mod:`dvasim.core.arith` (the clock path's sums), the standard library, numpy and
pandas; torch only in ``zoo``, ``stages``, ``profiling``, ``gpu_model`` and ``build_gpu_tables`` (the simulator
imports none of them).
"""

from __future__ import annotations

from dvasim.model.table import DEFAULT_TABLE_PATH, LatencyTable, default_table_path

__all__ = ["LatencyTable", "DEFAULT_TABLE_PATH", "default_table_path"]
