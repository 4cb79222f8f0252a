"""Fitting the simulator to real runs and checking the fit: :mod:`~dvasim.fitting.fit` (``dvasim fit``: an engine
file from replay logs), :mod:`~dvasim.fitting.logs` (reading replay folders), :mod:`~dvasim.fitting.check` (the
fit's self-check), :mod:`~dvasim.fitting.validate`
(``dvasim validate``: the simulator against the replay) and :mod:`~dvasim.fitting.contention` (a check, not a fit:
a replay's slowdowns of overlapped executions against ``[engine] contention``).

May import: everything below it (the one-run API, the engines, reporting, model data); never the command line.
"""
