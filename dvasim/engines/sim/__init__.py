"""The SimPy engine and the device-sharing model."""

from dvasim.engines.sim.device import MODES, Device
from dvasim.engines.sim.engine import DeadlockError, SimResult, simulate

__all__ = ["MODES", "DeadlockError", "Device", "SimResult", "simulate"]
