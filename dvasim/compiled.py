"""The compiled core: which modules the build compiles with mypyc (``setup.py``, so ``pip install``;
``tools/compile_core.py`` for ``make compiled``), which core an import runs, and why.

``pip install`` builds each compiled module as an extension next to its ``.py`` file where a C compiler exists,
and installs the pure modules where none does (``setup.py``). Python's import system takes an extension module
before a ``.py`` of the same name in the same folder; :func:`select_core`, which ``import dvasim`` runs first,
makes the pure modules win instead when ``DVASIM_CORE=pure`` is set or when the build is older than its sources
(the hashes in :data:`MANIFEST` differ: an edited checkout runs what its sources say, never a stale build). Results
are the same, bit for bit, either way (``tests/test_compiled.py`` checks golden runs); ``dvasim --version`` says
which core runs (:func:`core`).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.util
import json
import os
import sys
from pathlib import Path

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
GROUP = "dvasim.core_mypyc"  # the shared library every compiled module's shim loads (inside the package)
MANIFEST = "_compiled_core.json"  # written by the build next to the modules: built or not, why, the sources' hashes
PACKAGE = Path(__file__).resolve().parent

_CORE: tuple[str, str] | None = None  # what select_core decided: ("compiled" | "pure", why)


def compiled_modules() -> dict[str, bool]:
    """For each module of :data:`COMPILED_MODULES`: True if the imported module is the compiled extension (its
    file a ``.so`` / ``.pyd``), False if it is the pure-Python source."""
    out: dict[str, bool] = {}
    for name in COMPILED_MODULES:
        path = getattr(importlib.import_module(name), "__file__", None) or ""
        out[name] = path.endswith(EXTENSION_SUFFIXES)
    return out


def _source(name: str) -> Path:
    return (PACKAGE.parent / Path(*name.split("."))).with_suffix(".py")


def source_hashes(root: Path | None = None) -> dict[str, str]:
    """The SHA-256 of each compiled module's source under ``root`` (the folder holding ``dvasim``; default this
    package's): what the build records in :data:`MANIFEST` (``setup.py``) and an import compares."""
    base = PACKAGE.parent if root is None else Path(root)
    return {name: hashlib.sha256((base / Path(*name.split("."))).with_suffix(".py").read_bytes()).hexdigest()
            for name in COMPILED_MODULES}


def _built(name: str) -> bool:
    folder, stem = _source(name).parent, name.rsplit(".", 1)[-1]
    return any(p.name.startswith(stem + ".") and p.name.endswith(EXTENSION_SUFFIXES) for p in folder.iterdir())


def _decide() -> tuple[str, str]:
    if os.environ.get("DVASIM_CORE", "").strip().lower() == "pure":
        return "pure", "DVASIM_CORE=pure"
    try:
        manifest = json.loads((PACKAGE / MANIFEST).read_text())
    except (OSError, ValueError):
        manifest = None
    built = [name for name in COMPILED_MODULES if _built(name)]
    if not built:
        why = manifest.get("why") if isinstance(manifest, dict) and not manifest.get("built") else ""
        return "pure", f"not compiled: {why}" if why else "no compiled build found"
    if len(built) < len(COMPILED_MODULES) or not isinstance(manifest, dict) or not manifest.get("built"):
        return "pure", "an incomplete compiled build was found; `make compiled` rebuilds it"
    sources, now = manifest.get("sources") or {}, source_hashes()
    for name in COMPILED_MODULES:
        if sources.get(name) != now[name]:
            rel = _source(name).relative_to(PACKAGE.parent)
            return "pure", f"the compiled build is older than {rel}; `make compiled` rebuilds it"
    return "compiled", f"mypyc, {len(COMPILED_MODULES)} modules"


class _PureFinder(importlib.abc.MetaPathFinder):
    """Finds the compiled modules' ``.py`` sources ahead of their built extensions."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in COMPILED_MODULES:
            return importlib.util.spec_from_file_location(fullname, _source(fullname))
        return None


def select_core() -> tuple[str, str]:
    """Decide once per process which core runs (see the module's docstring) and, for the pure one, put the
    sources ahead of any built extension; returns ``(core, why)``. Must run before a compiled module is
    imported (``dvasim/__init__.py`` calls it first); a module already imported is left as it is."""
    global _CORE
    if _CORE is None:
        _CORE = _decide()
        if _CORE[0] == "pure" and not any(isinstance(f, _PureFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, _PureFinder())
    return _CORE


def core() -> str:
    """One line for ``dvasim --version``: which core runs and why, e.g. ``compiled (mypyc, 13 modules)``."""
    kind, why = select_core()
    actual = compiled_modules()
    if kind == "compiled" and not all(actual.values()):
        return "pure Python (the compiled modules were not the ones imported)"
    return f"compiled ({why})" if kind == "compiled" else f"pure Python ({why})"
