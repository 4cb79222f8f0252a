"""Build dvasim's optional compiled core with mypyc: one extension module next to each ``.py`` file of
:data:`dvasim.compiled.COMPILED_MODULES`, and the shared library they all load
(``dvasim/core_mypyc__mypyc.*.so``). Python imports an extension module before a ``.py`` file of the same name
in the same folder, so the package imported from that tree (this checkout's editable install included) runs them.

    python tools/compile_core.py            # make compiled: build in place, in this checkout
    python tools/compile_core.py --clean    # make pure: remove what a build left
    python tools/compile_core.py --copy-to DIR   # copy the package to DIR (the shipped data linked) and build there

The C sources and object files go to ``build/mypyc`` of the tree built. The environment variable
``MYPYC_OPT_LEVEL`` (0-3, default 3) sets the C compiler's optimisation level. Needs mypy (which brings mypyc)
and a C compiler; it uses the Python that runs it, whose version the modules are then built for.

mypyc compiles only code that type-checks. The modules are checked with these relaxations (``MYPY_CONFIG`` of ``setup.py``, whose
builder this script shares with ``pip install``):
imports other than the mechanism's own modules and simpy are not followed (typed Any), and the checks that a value
typed ``X | None`` is not None where an ``X`` is needed (``union-attr``, ``index``, ``arg-type``,
``return-value``) are off: the mechanism relies on invariants there that its types do not show (a pulled item
has a buffer pair). mypyc checks each such value at run time and raises ``TypeError`` if it is None.
"""

from __future__ import annotations

import argparse
import os
import runpy
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BUILD_DIR = Path("build") / "mypyc"  # relative to the tree built
# the build's own pieces (setup.py: the list, mypy's settings, the C flags, the manifest), read without importing
# dvasim or running setup()
SETUP = runpy.run_path(str(REPO / "setup.py"), run_name="dvasim_setup")
EXTENSION_SUFFIXES = tuple(SETUP["CORE"]["EXTENSION_SUFFIXES"])


def compiled_module_names(root: Path) -> tuple[str, ...]:
    """The list in ``root``'s ``dvasim/compiled.py`` (read without importing dvasim)."""
    return tuple(runpy.run_path(str(root / "dvasim" / "compiled.py"))["COMPILED_MODULES"])


def built_files(root: Path) -> list[Path]:
    """The extension modules under ``root/dvasim`` (the package ships no other native code)."""
    return sorted(p for p in (root / "dvasim").rglob("*") if p.is_file() and p.name.endswith(EXTENSION_SUFFIXES))


def clean(root: Path) -> list[Path]:
    """Remove the built extension modules and the build's leftovers; returns what was removed."""
    gone = built_files(root)
    manifest = root / "dvasim" / SETUP["CORE"]["MANIFEST"]
    if manifest.exists():
        gone.append(manifest)
    for p in gone:
        p.unlink()
    if (root / BUILD_DIR).exists():
        shutil.rmtree(root / BUILD_DIR)
        gone.append(root / BUILD_DIR)
    build = root / "build"
    if build.is_dir() and not any(build.iterdir()):
        build.rmdir()
    return gone


def copy_package(dest: Path, src: Path = REPO) -> Path:
    """Copy ``src``'s ``dvasim`` package to ``dest/dvasim`` (no caches, no built modules) and link the shipped
    data (``traces``, ``configs``) beside it, so the copy runs the named models; returns ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src / "dvasim", dest / "dvasim",
                    ignore=shutil.ignore_patterns("__pycache__", *(f"*{s}" for s in EXTENSION_SUFFIXES)))
    for data in ("traces", "configs"):
        if (src / data).is_dir() and not (dest / data).exists():
            (dest / data).symlink_to(src / data, target_is_directory=True)
    return dest


def build(root: Path, opt_level: str = "3") -> list[Path]:
    """Compile the modules of ``root/dvasim`` and put each extension module next to its source, with the
    manifest of the sources they were built from; returns them."""
    try:
        import mypyc.build  # noqa: F401
        from setuptools import setup
    except ImportError as e:
        raise SystemExit(f"compile_core: mypyc is not installed ({e}); pip install mypy") from None
    clean(root)
    work = root / BUILD_DIR
    work.mkdir(parents=True, exist_ok=True)
    cwd = os.getcwd()
    os.chdir(work)  # setuptools reads a pyproject.toml in the working directory: there is none here
    try:
        extensions = SETUP["mypyc_extensions"](root, Path("."), opt_level)
        setup(name="dvasim-compiled-core", ext_modules=extensions, script_args=[
            "-q", "build_ext", "--build-lib", "lib", "--build-temp", "temp", "--parallel", str(os.cpu_count() or 1)])
    finally:
        os.chdir(cwd)
    lib = work / "lib"
    for so in sorted(lib.rglob("*")):
        if so.is_file() and so.name.endswith(EXTENSION_SUFFIXES):
            shutil.copy2(so, root / so.relative_to(lib))
    shutil.rmtree(work / ".mypy_cache", ignore_errors=True)
    SETUP["write_manifest"](root / "dvasim", True, source_root=root)
    return built_files(root)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=REPO, help="the directory holding the dvasim package to build")
    ap.add_argument("--copy-to", type=Path, help="copy the package to this directory and build the copy")
    ap.add_argument("--clean", action="store_true", help="remove the compiled modules and the build's leftovers")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    if args.clean:
        gone = clean(root)
        print(f"removed {len(gone)} built file(s) under {root}")
        return
    opt = os.environ.get("MYPYC_OPT_LEVEL", "3")
    if opt not in ("0", "1", "2", "3"):
        raise SystemExit(f"compile_core: MYPYC_OPT_LEVEL must be 0, 1, 2 or 3, got {opt!r}")
    if args.copy_to is not None:
        root = copy_package(args.copy_to.resolve(), root)
    t0 = time.perf_counter()
    built = build(root, opt)
    print(f"compiled {len(compiled_module_names(root))} modules with mypyc (-O{opt}) in "
          f"{time.perf_counter() - t0:.1f} s under {root}: {', '.join(p.name.split('.')[0] for p in built)}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
