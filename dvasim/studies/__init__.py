"""Studies built from many runs: the paper's evaluation methodology (:mod:`~dvasim.studies.evaluation`: stepping
load, peak throughput, the loads compared), ``dvasim compare`` (:mod:`~dvasim.studies.compare`), sweeps
(:mod:`~dvasim.studies.sweep`), capacity searches (:mod:`~dvasim.studies.capacity`) and the characterization
study (:mod:`~dvasim.studies.characterization`).

May import: the one-run API (:mod:`dvasim.api`) and everything below it; never fitting or the command line.
"""
