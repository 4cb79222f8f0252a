"""The SimPy engine (:mod:`~dvasim.engines.sim.engine`), the device-sharing model
(:mod:`~dvasim.engines.sim.device`), the simulator's co-run profile for E-Ebird
(:mod:`~dvasim.engines.sim.corun`); the contention of overlapped executions is
calibrated on a GPU's four-thread co-run by :mod:`dvasim.studies.contention`.

May import: simpy and the layers below the engines; never torch.
"""

from dvasim.engines.sim.device import MODES, Device
from dvasim.engines.sim.engine import DeadlockError, SimOptions, SimResult, Simulation, simulate

__all__ = ["MODES", "DeadlockError", "Device", "SimOptions", "SimResult", "Simulation", "simulate"]
