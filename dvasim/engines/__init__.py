"""The engines that run a config: the SimPy simulator (:mod:`dvasim.engines.sim`) and the replay on real torch
execution (:mod:`dvasim.engines.replay`). Both drive the same mechanism and policy objects.

May import: everything below them (foundation, mechanism, policies, model data, workloads, serving stacks,
config, reporting); never the one-run API, the studies, fitting or the command line. ``engines.sim`` imports
simpy and never torch; ``engines.replay`` imports torch.
"""
