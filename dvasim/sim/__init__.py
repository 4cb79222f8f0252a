"""The SimPy engine and the device-sharing model."""

from dvasim.sim.device import MODES, Device
from dvasim.sim.engine import DeadlockError, SimResult, simulate

__all__ = ["MODES", "DeadlockError", "Device", "SimResult", "simulate"]
