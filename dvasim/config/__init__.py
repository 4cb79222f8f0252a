"""TOML configs: the schema (every section's keys, types, ranges, defaults and help, declared once), loading,
``--set`` overrides, validation with one-line errors naming the field, and the generated reference
(``docs/config.md``, ``dvasim config [SECTION]``).

* :mod:`dvasim.config.sections` -- the schema, assembled from each section's declaration;
* :mod:`dvasim.config.files` -- reading a config file and an engine file;
* :mod:`dvasim.config.pins` -- an engine file's ``[pinned]`` choices (what it was fitted under), applied or refused;
* :mod:`dvasim.config.overrides` -- ``--set``;
* :mod:`dvasim.config.check` -- :func:`resolve`: defaults, checks, the rules tying keys together;
* :mod:`dvasim.config.reference` -- the reference and the help, rendered from the schema;
* :mod:`dvasim.config.triton` -- ``[policy] triton_config``: a Triton model configuration read with protobuf.

Relative paths are looked up next to the config file, then in the working directory, then in the project root
(where the shipped ``traces/`` live).

May import: the foundation, the mechanism's limits (:mod:`dvasim.core`), the policies (whose parameters a Triton
configuration fills), model data, workloads and serving stacks (whose sections it assembles), and protobuf; never
the engines, reporting, studies or the command line.
"""

from __future__ import annotations

from dvasim.config.check import resolve
from dvasim.config.files import apply_engine_file, load_toml
from dvasim.config.overrides import UNSET, apply_overrides, parse_override
from dvasim.config.sections import (
    DEFAULTS,
    ENGINE,
    MAX_BUFFER_PAIRS,
    MAX_CORES,
    QOS,
    REPLAY,
    SCHEMA,
    SECTIONS,
)
from dvasim.core.pipeline import MAX_INSTANCES
from dvasim.paths import DATA_ROOT, PROJECT_ROOT
from dvasim.schema import find_file

__all__ = ["DATA_ROOT", "DEFAULTS", "ENGINE", "MAX_BUFFER_PAIRS", "MAX_CORES", "MAX_INSTANCES", "PROJECT_ROOT", "QOS",
           "REPLAY", "SCHEMA", "SECTIONS", "UNSET", "apply_engine_file", "apply_overrides", "find_file", "load_toml",
           "parse_override", "resolve"]
