"""Build dvasim with its compiled core where it can be built (issue 37): ``pip install`` (and ``pip install -e``)
compiles the hot modules of :data:`dvasim.compiled.COMPILED_MODULES` with mypyc, as mypyc-compiled packages such as
black and mypy ship, and falls back to the same pure-Python modules where it cannot (no C compiler, no Python
headers, mypyc missing, or ``DVASIM_CORE=pure`` in the environment), saying so in one line. Results are the same,
bit for bit, either way (``tests/test_compiled.py``); ``dvasim --version`` says which core runs.

Everything else about the package (name, dependencies, the shipped data) is in ``pyproject.toml``. The build
writes :data:`dvasim.compiled.MANIFEST` next to the modules: the SHA-256 of each compiled module's source, so an
import can tell a build older than its sources and run the pure modules instead (:func:`dvasim.compiled.core`).
``tools/compile_core.py`` (``make compiled``) builds in place with :func:`mypyc_extensions` too.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import warnings
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
CORE = runpy.run_path(str(HERE / "dvasim" / "compiled.py"))  # the list and the build's settings, without importing dvasim

# mypy's settings for mypyc's type check: only the compiled modules, the plain modules of the mechanism they build
# on and simpy are analysed; other imports are typed Any (checking numpy's stubs would triple the build time). The
# checks that a value typed ``X | None`` is not None where an ``X`` is needed are off: the mechanism relies on
# invariants there that its types do not show (a pulled item has a buffer pair); mypyc checks each such value at
# run time and raises ``TypeError`` if it is None
MYPY_CONFIG = """\
[mypy]
follow_imports = skip
ignore_missing_imports = True
warn_unused_ignores = False
disable_error_code = union-attr, index, arg-type, return-value

[mypy-dvasim.core.*,dvasim.errors,simpy.*]
follow_imports = silent
"""
# mypyc compiles with -Werror; gcc 12 takes the NaN tests it generates (x != x) for tautologies (MSVC: no -W flags)
EXTRA_CFLAGS = [] if sys.platform == "win32" else ["-Wno-tautological-compare"]


def mypyc_extensions(root: Path, work: Path, opt_level: str = "3") -> list:
    """mypyc's extension modules for the compiled modules under ``root`` (C sources generated in ``work``, which
    must be the working directory when they are built). Raises if mypyc is missing or the modules do not
    type-check."""
    from mypyc.build import mypycify

    work.mkdir(parents=True, exist_ok=True)
    (work / "mypy.ini").write_text(MYPY_CONFIG)
    sources = [str(root / Path(*name.split(".")).with_suffix(".py")) for name in CORE["COMPILED_MODULES"]]
    exts = mypycify(["--config-file", str(work / "mypy.ini"), *sources], opt_level=opt_level,
                    group_name=CORE["GROUP"], target_dir=str(work))
    for ext in exts:
        ext.extra_compile_args = [*ext.extra_compile_args, *EXTRA_CFLAGS]
    return exts


def write_manifest(package_dir: Path, built: bool, why: str = "", source_root: Path = HERE) -> None:
    """Record next to the package's modules what the build made (:data:`dvasim.compiled.MANIFEST`), with the
    hashes of the sources under ``source_root`` it compiled."""
    package_dir.mkdir(parents=True, exist_ok=True)
    (package_dir / CORE["MANIFEST"]).write_text(json.dumps(
        {"built": built, "why": why, "python": sys.version.split()[0],
         "sources": CORE["source_hashes"](source_root) if built else {}}, indent=1, sort_keys=True) + "\n")


def packages() -> list[str]:
    """The code packages and the shipped data's folders (``traces/`` as ``dvasim.traces``, ``configs/`` as
    ``dvasim.configs``: pyproject.toml's package-dir and package-data): setuptools takes a data folder whose
    name could be imported for a package, and warns unless it is listed."""
    names = [*find_packages(str(HERE), include=["dvasim", "dvasim.*"]), "dvasim.config.triton"]
    for prefix, folder in (("dvasim.traces", HERE / "traces"), ("dvasim.configs", HERE / "configs")):
        for d in [folder, *sorted(p for p in folder.rglob("*") if p.is_dir())]:
            parts = d.relative_to(folder).parts
            if all(part.isidentifier() for part in parts) and "__pycache__" not in parts:
                names.append(".".join((prefix, *parts)))
    return names


def _say(line: str) -> None:
    print(f"dvasim build: {line}", file=sys.stderr)


class OptionalBuildExt(build_ext):
    """build_ext that installs the pure core, with one line saying why, where the compiled one fails to build;
    and writes the manifest either way."""

    def run(self) -> None:
        package_dir = (HERE if self.inplace else Path(self.build_lib)) / "dvasim"
        try:
            super().run()
        except Exception as e:  # a compiler error, a missing compiler or header: all or nothing (one group library)
            for p in package_dir.rglob("*"):
                if p.name.endswith(tuple(CORE["EXTENSION_SUFFIXES"])):
                    p.unlink()
            why = f"the C build failed ({type(e).__name__})"
            _say(f"{why}; installing the pure-Python core (same results, slower)")
            write_manifest(package_dir, False, why)
            return
        write_manifest(package_dir, True)


def _extensions() -> tuple[list, str]:
    if os.environ.get("DVASIM_CORE", "").strip().lower() == "pure":
        return [], "DVASIM_CORE=pure at install"
    try:
        return mypyc_extensions(HERE, Path("build") / "mypyc", os.environ.get("MYPYC_OPT_LEVEL", "3")), ""
    except ImportError as e:
        why = f"mypyc is not installed ({e})"
    except (Exception, SystemExit) as e:  # mypy's type check failed (it exits), or mypyc itself did
        why = f"mypyc could not compile the core ({type(e).__name__}: {e})"
    _say(f"{why}; installing the pure-Python core (same results, slower)")
    return [], why


if __name__ == "__main__":
    # setuptools' note on every editable install (`pip install -e .`, so `make run`): the checkout's own folders may
    # shadow the package; information for no action, and the one build message a user would see
    warnings.filterwarnings("ignore", message=r"\s*Editable installation")
    EXTENSIONS, _ = _extensions()
    setup(packages=packages(), ext_modules=EXTENSIONS, cmdclass={"build_ext": OptionalBuildExt})
