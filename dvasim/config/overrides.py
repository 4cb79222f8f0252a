"""``--set section.key=value`` overrides, applied in order to a config's tables before it is checked. Which
sections and sub-tables exist comes from the schema (:mod:`dvasim.config.sections`)."""

from __future__ import annotations

import copy
from typing import Any

import tomllib

from dvasim.config.sections import SECTIONS, SUBSECTIONS
from dvasim.errors import ConfigError

UNSET = object()  # the value of an override that removes its key


def parse_override(text: str) -> tuple[str, str | None, Any]:
    """One ``--set``: ``section.key=value`` -> (section, key, value), the value read as TOML, else kept as a
    string; ``section={...}`` (an inline table) -> (section, None, table): the whole section replaced;
    ``section.key`` without ``=`` -> (section, key, UNSET): the key removed."""
    lhs, eq, rhs = text.partition("=")
    lhs = lhs.strip()
    if not lhs:
        raise ConfigError("--set", f"expected section.key=value, section={{...}} or section.key (to unset), got {text!r}")
    section, dot, key = lhs.partition(".")
    if not eq:
        if not dot or not key:
            raise ConfigError("--set", f"expected section.key=value, section={{...}} or section.key (to unset), "
                                       f"got {text!r}")
        return section, key, UNSET
    try:
        value = tomllib.loads(f"v = {rhs.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = rhs.strip()
    if not dot:
        if not isinstance(value, dict):
            raise ConfigError(f"--set {section}", f"a whole section takes an inline table, e.g. "
                                                  f"{section}={{kind = \"poisson\", rate_qps = 100}}; got {rhs.strip()!r}")
        return section, None, value
    return section, key, value


def apply_overrides(raw: dict[str, Any], overrides: list[str] | None) -> dict[str, Any]:
    """Apply ``--set`` overrides in order (see :func:`parse_override`): set a key, replace a whole section (a
    change of its shape: another workload kind, another policy with its own parameters) or unset a key. A key of a
    sub-table (``engine.host.cores=8``) sets that table's key."""
    raw = copy.deepcopy(raw)
    for text in overrides or []:
        section, key, value = parse_override(text)
        if section not in SECTIONS:
            where = section if key is None else f"{section}.{key}"
            raise ConfigError(where, f"unknown section [{section}]; allowed: {', '.join(SECTIONS)}")
        if key is None:
            raw[section] = value
            continue
        table = raw.setdefault(section, {})
        sub, dot, rest = key.partition(".")
        if dot and f"{section}.{sub}" in SUBSECTIONS:  # a key of [engine.host] / [engine.transfer]
            table, key = table.setdefault(sub, {}), rest
            if not isinstance(table, dict):
                raise ConfigError(f"{section}.{sub}", f"must be a table of keys ([{section}.{sub}]), see "
                                                      f"dvasim config {section}.{sub}")
        if value is UNSET:
            table.pop(key, None)
        else:
            table[key] = value
    return raw

