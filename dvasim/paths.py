"""Where the shipped data lives: ``traces/`` and ``configs/`` next to the package in a checkout (or an editable
install), or inside the installed package (``dvasim/traces``, ``dvasim/configs``: the wheel's package data), or
``DVASIM_TRACES_DIR`` for the traces.

Relative data paths (``traces/...`` in a config, ``configs/default.toml`` on the command line) are looked up,
after the working directory, under :data:`DATA_ROOT`, the directory that holds ``traces/`` and ``configs/``, so
the same commands run from a checkout and from an installed wheel, in any working directory.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = PACKAGE_DIR.parent  # the checkout (site-packages when installed)
DATA_ROOT = PROJECT_ROOT if (PROJECT_ROOT / "traces").is_dir() else PACKAGE_DIR


def traces_dir() -> Path:
    """The shipped data directory (override with the environment variable ``DVASIM_TRACES_DIR``)."""
    env = os.environ.get("DVASIM_TRACES_DIR")
    return Path(env) if env else DATA_ROOT / "traces"
