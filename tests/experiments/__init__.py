"""Tests of the experiment scripts; :func:`load_experiment` imports one of them as a module."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXP = Path(__file__).resolve().parents[2] / "experiments"


def load_experiment(name: str) -> ModuleType:
    """``experiments/<name>.py`` (``name`` may hold a folder: ``validation/gpu_matrix``) as the module
    ``_exp_<its stem>``, with ``experiments/`` on the path for the scripts' shared ``common``."""
    if str(EXP) not in sys.path:
        sys.path.insert(0, str(EXP))
    path = EXP / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_exp_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod
