"""The language the config schema is declared in, and the checks every layer shares: a key's type, range,
default and help, declared once (:class:`Key`), checked with a one-line error naming the field, rendered as help
and as the config reference. Foundation: may import only the standard library, :mod:`dvasim.errors` and
:mod:`dvasim.paths`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from dvasim.errors import ConfigError
from dvasim.paths import DATA_ROOT


def find_file(value: Any, base_dir: str | None, field: str, hint: str = "") -> Path:
    """A data file named in a config: an absolute path, or relative to ``base_dir`` (the config's directory),
    the working directory, then :data:`DATA_ROOT` (the shipped ``traces/``). ConfigError naming ``field``
    (followed by ``hint``) if there is none."""
    if not isinstance(value, str) or not value:
        raise ConfigError(field, f"must be a file path string, got {value!r}")
    p = Path(value).expanduser()
    candidates = [p] if p.is_absolute() else [Path(base_dir or ".") / p, Path.cwd() / p, DATA_ROOT / p]
    for c in candidates:
        if c.is_file():
            return c.resolve()
    where = "" if p.is_absolute() else (f" (looked next to the config, in the working directory and in {DATA_ROOT}, "
                                        "where the shipped traces/ are)")
    raise ConfigError(field, f"file {value!r} not found{where}{hint}")


def check_keys(section: str, values: dict[str, Any], allowed) -> None:
    """Every key of the table ``section`` is one of ``allowed`` (else a one-line error naming it)."""
    for key in values:
        if key not in allowed:
            raise ConfigError(f"{section}.{key}", f"unknown key; allowed: {', '.join(sorted(allowed))}")


def check_number(d: dict, section: str, key: str, minimum: float, strict: bool = False) -> None:
    """``d[key]`` is a finite number >= ``minimum`` (> with ``strict``); stored as a float."""
    v = d[key]
    ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
    ok = ok and (v > minimum if strict else v >= minimum)
    if not ok:
        rel = ">" if strict else ">="
        raise ConfigError(f"{section}.{key}", f"must be a number {rel} {minimum:g}, got {v!r}")
    d[key] = float(v)
