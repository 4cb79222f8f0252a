"""The optional compiled core: which modules ``make compiled`` builds with mypyc (``tools/compile_core.py``), and
whether the imported ones are the compiled extensions.

The pure-Python modules stay the default and the reference: a compiled module is built in place, next to its
``.py`` file, and Python's import system takes an extension module before a ``.py`` of the same name in the same
folder; ``make pure`` removes the built files. Results are the same, bit for bit, either way
(``tests/test_compiled.py`` checks golden runs).
"""

from __future__ import annotations

import importlib

# the modules mypyc compiles: the mechanism's hot paths (the pipeline's control plane, the batch table, executors
# and buffer pairs it calls on every stage execution), the query records they all read and write, the meta
# operations the policies answer with and the clock tolerance, the version-independent sums (arith: the device adds
# with them after every finish, the DVABatch policy at every decision), the device-sharing model, the SimPy engine,
# the records' packed rows, and the DVABatch policy, Triton's dynamic batcher (ZeroBatch, DelayBatch) and the
# policies' base classes, each measured to pay. Left pure: the engine's result and errors (dvasim.engines.sim.result).
#
# The compiled policy classes take interpreted subclasses (@mypyc_attr(allow_interpreted_subclasses=True),
# dvasim.core.compiling): the other policies, users' and tests' subclass them; a class attribute a subclass sets is
# declared ClassVar (else mypyc makes it an instance attribute with the base's value). A compiled module reads
# natively only what its annotations type: a module-level constant is Final (else it is looked up in the module's
# dict at each use), and a builtin over a generator or with keywords (max, min) is a loop (else it is a generic
# call). A dataclass here writes its __init__ out: the one dataclass generates is interpreted code even in a
# compiled module
COMPILED_MODULES: tuple[str, ...] = (
    "dvasim.core.arith",
    "dvasim.core.query",
    "dvasim.core.operations",
    "dvasim.core.buffers",
    "dvasim.core.batch_table",
    "dvasim.core.executor",
    "dvasim.core.pipeline",
    "dvasim.engines.sim.device",
    "dvasim.engines.sim.engine",
    "dvasim.reporting.rows",
    "dvasim.policies.base",
    "dvasim.policies.dvabatch",
    "dvasim.policies.triton",
)

EXTENSION_SUFFIXES = (".so", ".pyd")


def compiled_modules() -> dict[str, bool]:
    """For each module of :data:`COMPILED_MODULES`: True if the imported module is the compiled extension (its
    file a ``.so`` / ``.pyd``), False if it is the pure-Python source."""
    out: dict[str, bool] = {}
    for name in COMPILED_MODULES:
        path = getattr(importlib.import_module(name), "__file__", None) or ""
        out[name] = path.endswith(EXTENSION_SUFFIXES)
    return out
