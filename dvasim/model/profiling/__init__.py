"""Profiling real torch stages: :mod:`~dvasim.model.profiling.profiler` measures per-stage latency tables
(and launch tables) of the zoo's models as serving stacks run them; :mod:`~dvasim.model.profiling.sharing`
measures how co-running stages share a device.

May import: the rest of :mod:`dvasim.model` (the zoo, the stage runners, tables and slicing), the foundation and
torch.
"""
