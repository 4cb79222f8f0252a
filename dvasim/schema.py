"""The language the config schema is declared in, and the checks every layer shares.

A section of a config is a :class:`Section` of :class:`Key` objects: each key's type, range, default and help,
declared once. From that one declaration come the check (a one-line :class:`~dvasim.errors.ConfigError` naming the
field and what is allowed), the defaults, ``dvasim config``'s help and the generated config reference
(``docs/config.md``). The sections themselves are declared where their meaning lives (the model's in
:mod:`dvasim.model.catalog`, the serving stack's in :mod:`dvasim.server`, the workload's in
:mod:`dvasim.workload.config`) and assembled into the whole schema by :mod:`dvasim.config.sections`.

Foundation: may import only the standard library, :mod:`dvasim.errors` and :mod:`dvasim.paths`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dvasim.errors import ConfigError
from dvasim.paths import DATA_ROOT

KINDS = ("int", "number", "bool", "str", "choice", "path", "numbers", "quantiles", "per_stage", "ints",
         "table", "list", "any")
_NO_DEFAULT = object()

# ------------------------------------------------------------------------------------------ physical ranges
# A number far beyond what any server shows makes no meaningful simulation: 1e308 ms of launch overhead makes every
# latency inf, a copy at 1e-320 GB/s takes inf ms, and a clock that reaches inf (then nan) never advances, so the run
# hangs (issue 37). So every time, bandwidth and rate of the schema has a physical range, one rule per unit, applied
# by the key's name (its unit suffix: Key.__post_init__) within whatever tighter bounds the key declares itself:
MAX_MS = 1e6
"""``*_ms``: a time (a cost, a delay, a target) is at most 1e6 ms, 16.7 minutes (and at least -1e6 ms where it may be
negative). No serving cost or delay comes near it: a client gives up on a query within minutes. The clock stays
exact too: 2e7 queries (a run's most) each paying several such times end near 1e14 ms, where a double still resolves
0.02 ms."""
MIN_GBPS = 1e-3
"""``*_gbps``: a bandwidth is at least 1e-3 GB/s (1 MB/s), 250 times slower than one lane of PCIe 1.0 (250 MB/s), the
slowest host link there is; a 224x224 float32 image (602 kB) then copies in 602 ms. ``inf`` (free) stays allowed
where the key allows it."""
MIN_QPS, MAX_QPS = 1e-6, 1e9
"""``*_qps``: a rate is at least 1e-6 queries per second (a mean gap of 1e9 ms, 11.6 days: a month of sparse traffic
still has a few queries; the arrivals' span is bounded apart, dvasim.workload.config.MAX_ARRIVAL_MS) and at most 1e9
(a gap of 1e-6 ms: below that, arrivals are simultaneous at the clock's resolution)."""
MAX_FACTOR = 1e3
"""A slowdown or a scale of costs (declared with it, e.g. ``engine.corun_slowdown``) is at most 1000 (a scale at least
1/1000): measured co-run slowdowns are 1.1 to 1.2 (experiments/validation/configs), and a host a thousand times
slower or faster than the profiled one is another machine, to be profiled."""
MAX_BYTES = 1e12
"""A query's input size is at most 1e12 bytes (1 TB, seven times an H200's 141 GB of memory: no query's input fits
on any accelerator beyond it)."""
_UNIT_RULES = {"_ms": (-MAX_MS, MAX_MS, "ms"), "_gbps": (MIN_GBPS, None, "GB/s"),
               "_qps": (MIN_QPS, MAX_QPS, "queries per second")}
_RANGED = ("number", "numbers", "per_stage", "quantiles")


def unit_range(name: str) -> tuple[float, float | None, str] | None:
    """The physical range of a number named in a unit (``*_ms``, ``*_gbps``, ``*_qps``): ``(lowest, highest or
    None, unit)``; ``None`` for a name in no unit. Every key of the schema is held to it (:class:`Key`), and so
    are a policy's parameters (:mod:`dvasim.config.check`)."""
    return next((r for suffix, r in _UNIT_RULES.items() if name.endswith(suffix)), None)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


@dataclass(frozen=True)
class Key:
    """One key of a section.

    ``kind``: ``int``, ``number`` (finite unless ``allow_inf``), ``bool``, ``str``, ``choice`` (one of
    ``choices``), ``path`` (a file, found next to the config), ``numbers`` / ``ints`` (lists), ``quantiles`` (a
    non-decreasing list of >= 2 numbers), ``per_stage`` (a number, or a list of one per stage), ``table`` (a
    sub-section: ``section``), ``list`` (a list the owner checks), ``any`` (checked by its owner). ``minimum`` /
    ``maximum`` bound numbers and list entries (``strict``: the minimum itself is out); a key named ``*_ms``,
    ``*_gbps`` or ``*_qps`` is also held within its unit's physical range (:data:`MAX_MS`, :data:`MIN_GBPS`,
    :data:`MIN_QPS`), where it declares no tighter bound. ``default``: the value a run takes when the key is absent
    (``None`` in the reference: derived at run time, as ``help`` says). ``kinds``: for a section with a selector
    (the workload's ``kind``), the selector values that accept it."""

    name: str
    kind: str
    help: str
    default: Any = _NO_DEFAULT
    minimum: float | None = None
    maximum: float | None = None
    strict: bool = False
    strict_max: bool = False
    choices: tuple = ()
    allow_inf: bool = False
    section: Section | None = None
    kinds: tuple[str, ...] = ()
    unit: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"key {self.name}: unknown kind {self.kind!r}")
        rule = unit_range(self.name)
        if rule is not None and self.kind in _RANGED:  # the unit's physical range (see MAX_MS and the others)
            lo, hi, _ = rule
            if self.minimum is None or (lo > 0 and self.minimum < lo):  # signed: -MAX_MS; "> 0": the least rate
                object.__setattr__(self, "minimum", lo)
                object.__setattr__(self, "strict", False)
            if hi is not None and self.maximum is None:
                object.__setattr__(self, "maximum", hi)

    @property
    def has_default(self) -> bool:
        return self.default is not _NO_DEFAULT

    def range_text(self) -> str:
        """What the key accepts, in words (the error message's and the reference's)."""
        lo, hi = self.minimum, self.maximum
        if self.kind == "bool":
            return "true or false"
        if self.kind == "choice":
            return "one of " + ", ".join(repr(c) for c in self.choices)
        if self.kind in ("str", "path"):
            return "a file path string" if self.kind == "path" else "a string"
        if self.kind == "int":
            if hi is not None:
                return f"an integer in {int(lo)}..{int(hi)}"
            return f"an integer >= {int(lo)}" if lo is not None else "an integer"
        bound = ""
        if lo is not None and hi is not None:
            bound = f" in {'(' if self.strict else '['}{lo:g}, {hi:g}{')' if self.strict_max else ']'}"
        elif lo is not None:
            bound = f" {'>' if self.strict else '>='} {lo:g}"
        if self.kind == "number":
            return f"a number{bound}" + (" (inf allowed)" if self.allow_inf else "")
        if self.kind == "numbers":
            return f"a list of numbers{bound}"
        if self.kind == "ints":
            return f"a list of integers{bound}"
        if self.kind == "quantiles":
            return f"a list of >= 2 non-decreasing numbers{bound} (quantiles)"
        if self.kind == "per_stage":
            return f"a number{bound} or a list of one per stage"
        if self.kind == "table":
            return "a table of keys"
        return "see the help"

    def _in_range(self, v: float) -> bool:
        """Within the declared range; ints are compared exactly (a seed of 2**63 - 1 is not rounded to a float)."""
        if isinstance(v, float) and (math.isnan(v) or (math.isinf(v) and not self.allow_inf)):
            return False
        if isinstance(v, int) and not -1e300 < v < 1e300:  # beyond any float: no number key takes it
            return False
        lo, hi = self.minimum, self.maximum
        if lo is not None and (v < lo or (self.strict and v <= lo)):
            return False
        return hi is None or (v < hi if self.strict_max else v <= hi)

    def check(self, where: str, v: Any) -> Any:
        """``v`` checked and converted (ints stay ints, numbers become floats); ConfigError naming ``where``."""
        field_ = f"{where}.{self.name}"
        ok, out = True, v
        k = self.kind
        if k == "int":
            ok = isinstance(v, int) and not isinstance(v, bool) and self._in_range(v)
        elif k == "number":
            ok = _is_number(v) and self._in_range(v)
            out = float(v) if ok else v
        elif k == "bool":
            ok = isinstance(v, bool)
        elif k == "str":
            ok = isinstance(v, str)
        elif k == "path":
            ok = isinstance(v, str) and bool(v)
        elif k == "choice":
            ok = isinstance(v, str | int) and not isinstance(v, bool) and v in self.choices
        elif k in ("numbers", "ints", "quantiles"):
            num = (lambda x: isinstance(x, int) and not isinstance(x, bool)) if k == "ints" else _is_number
            ok = isinstance(v, list) and all(num(x) and self._in_range(x) for x in v)
            if ok and k == "quantiles":
                ok = len(v) >= 2 and all(b >= a for a, b in zip(v, v[1:]))
        elif k == "per_stage":
            items = v if isinstance(v, list) else [v]
            ok = bool(items) and all(_is_number(x) and self._in_range(x) for x in items)
        elif k == "table":
            if not isinstance(v, dict):
                raise ConfigError(field_, f"must be a table of keys ([{field_}])")
            if self.section is not None:
                self.section.check(v, where=field_)  # checked; the owner reads the table as given
            return v
        elif k == "list":
            ok = isinstance(v, list)
        if not ok:
            raise ConfigError(field_, f"must be {self.range_text()}, got {v!r}")
        return out


@dataclass(frozen=True)
class Section:
    """A config table: its keys, in the order the reference lists them, and what it is for.

    ``selector``: the key whose value picks which keys apply (the workload's ``kind``; each key's ``kinds``);
    ``open``: more keys are allowed and checked by the section's owner (a policy's parameters), listed by
    ``open_help``."""

    name: str
    help: str
    keys: tuple[Key, ...]
    selector: str | None = None
    open: bool = False
    open_help: str = ""
    by_name: dict[str, Key] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "by_name", {k.name: k for k in self.keys})

    def __getitem__(self, name: str) -> Key:
        return self.by_name[name]

    def default(self, name: str) -> Any:
        return self.by_name[name].default

    def defaults(self) -> dict[str, Any]:
        """The keys a run fills in when they are absent (those with a default other than None)."""
        return {k.name: k.default for k in self.keys if k.has_default and k.default is not None
                and k.kind != "table"}

    def allowed(self, table: dict[str, Any] | None = None) -> list[str]:
        """The keys this table may hold (for a section with a selector: those of its selector's value)."""
        if self.selector is None or table is None:
            return [k.name for k in self.keys]
        chosen = table.get(self.selector)
        return [k.name for k in self.keys if not k.kinds or chosen in k.kinds]

    def check(self, table: dict[str, Any], where: str | None = None, fill: bool = False) -> dict[str, Any]:
        """The table's keys checked (unknown keys, types, ranges), in a new dict; with ``fill``, the defaults of
        absent keys added."""
        where = where or self.name
        if not isinstance(table, dict):
            raise ConfigError(where, f"[{where}] must be a table of keys")
        if self.selector is not None and self.selector in table:
            self.by_name[self.selector].check(where, table[self.selector])
        allowed = self.allowed(table)
        out: dict[str, Any] = {}
        for key, v in table.items():
            if key not in allowed:
                if self.open:
                    out[key] = v
                    continue
                what = (f" for {self.selector} = {table.get(self.selector)!r}" if self.selector and
                        key in self.by_name else "")
                raise ConfigError(f"{where}.{key}", f"unknown key{what}; allowed: {', '.join(sorted(allowed))}")
            out[key] = self.by_name[key].check(where, v)
        if fill:
            out = {**{k: v for k, v in self.defaults().items() if k in allowed}, **out}
        return out


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
