"""dvasim: a discrete-event simulator of DNN inference serving with multi-entry multi-exit batching.

The public API: ``dvasim.run(config)`` returns a :class:`dvasim.api.RunResult` with the per-query records
as a pandas DataFrame (``.queries``) and the summary as a dict (``.summary``).
"""

from __future__ import annotations

from dvasim.compiled import select_core as _select_core

__version__ = "0.1.0"
_select_core()  # the compiled core if the build is current, else the pure modules (dvasim.compiled)


def run(config, **overrides):
    """Run one simulation. ``config`` is a path to a TOML file, a dict, or a :class:`dvasim.config.Config`."""
    from dvasim.api import run as _run

    return _run(config, **overrides)


__all__ = ["run", "__version__"]
