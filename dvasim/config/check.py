"""A config checked against the schema: defaults filled in, every key's type and range checked, and the rules
that tie keys together. One-line errors naming the field (:class:`~dvasim.errors.ConfigError`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from dvasim.config.files import apply_engine_file, load_toml
from dvasim.config.overrides import apply_overrides
from dvasim.config.sections import DEFAULTS, ENGINE, QOS, REPLAY, SCHEMA, SECTIONS
from dvasim.config.triton import apply_triton_config
from dvasim.errors import ConfigError
from dvasim.schema import MAX_MS, find_file, unit_range
from dvasim.server.router import router_name


def resolve(raw: dict[str, Any] | str | Path, overrides: list[str] | None = None,
            engine: str | Path | None = None) -> dict[str, Any]:
    """Return the config with defaults filled in and every section checked (a policy's parameters are checked by
    the policy, the workload's values by the workload builder after the schema's types). ``engine``: an engine
    file (``dvasim fit``) merged over ``[engine]`` before the overrides."""
    if isinstance(raw, str | Path):
        raw = load_toml(raw)
    raw = apply_engine_file(raw, engine)
    raw = apply_overrides(raw, overrides)
    base_dir = raw.pop("_base_dir", None) or raw.pop("base_dir", None)
    for section in raw:
        if section not in SECTIONS:
            raise ConfigError(section, f"unknown section [{section}]; allowed: {', '.join(SECTIONS)}")
        if not isinstance(raw[section], dict):
            raise ConfigError(section, f"[{section}] must be a table of keys")
    raw = apply_triton_config(raw, base_dir)  # [policy] triton_config: the policy and instances a Triton file sets
    cfg = {s: {**DEFAULTS[s], **raw.get(s, {})} for s in SECTIONS}
    cfg["base_dir"] = base_dir or str(Path.cwd())
    _check_model(cfg["model"], base_dir)
    if not cfg["workload"]:
        raise ConfigError("workload", 'missing section; e.g. [workload] kind = "poisson", rate_qps = 100, n_queries = 1000')
    for section in (ENGINE, QOS, REPLAY, SCHEMA["cluster"]):
        cfg[section.name] = {**cfg[section.name], **section.check(cfg[section.name])}
    _check_delay(cfg["engine"], "engine", "admission_delay_ms")
    _check_contention(cfg["engine"])
    _check_delay(cfg["cluster"], "cluster", "network_delay_ms")
    cfg["cluster"]["router"] = router_name(cfg["cluster"]["router"])
    SCHEMA["server"].check(cfg["server"])  # checked; the stack reads its overrides as given
    if not isinstance(cfg["policy"].get("name"), str):
        raise ConfigError("policy.name", "must be a string naming a policy")
    _check_policy_units(cfg["policy"])
    return cfg


def _check_policy_units(policy: dict[str, Any]) -> None:
    """A policy's parameter named in a unit: that unit's physical range (:func:`dvasim.schema.unit_range`), as every
    key of the schema has; tighter bounds and everything else are the policy's to check."""
    for key, v in policy.items():
        unit = unit_range(key)
        if unit is None or isinstance(v, bool) or not isinstance(v, int | float):
            continue
        lo, hi, what = unit
        if not (lo <= v <= (math.inf if hi is None else hi)):  # nan and inf too
            rng = f"at least {lo:g}" if hi is None else f"in [{lo:g}, {hi:g}]"
            raise ConfigError(f"policy.{key}", f"must be a finite number {rng} ({what}), got {v!r}")


def _check_model(model: dict[str, Any], base_dir: str | None) -> None:
    SCHEMA["model"].check(model)
    if "table" in model:
        model["table"] = str(find_file(model["table"], base_dir, "model.table"))
    elif "name" not in model:
        raise ConfigError("model", 'missing; set table = "path/to/latency.csv" or name = "bert_base", '
                                   'device = "titanrtx", stages = 4')


def _check_contention(engine: dict[str, Any]) -> None:
    """``[engine] contention = "overlap"`` acts on the fluid sharing model; its share only with it."""
    model = engine.get("contention", "none")
    if model == "overlap" and engine["sharing"] != "fluid":
        raise ConfigError("engine.contention", f'"overlap" applies to sharing = "fluid" only, not '
                                               f'{engine["sharing"]!r}; set contention = "none" or sharing = "fluid"')
    if "contention_share" in engine and model != "overlap":
        raise ConfigError("engine.contention_share", 'applies only with contention = "overlap" (the config has '
                                                     f'{model!r}); drop it or set contention = "overlap"')


def _check_delay(section: dict[str, Any], name: str, key: str) -> None:
    """A delay: a constant (ms) or the quantiles of its distribution (``[engine] admission_delay_ms``,
    ``[cluster] network_delay_ms``)."""
    ad = section[key]
    if isinstance(ad, list):
        if (len(ad) < 2 or not all(isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
                                   and 0 <= x <= MAX_MS for x in ad) or any(b < a for a, b in zip(ad, ad[1:]))):
            raise ConfigError(f"{name}.{key}", f"a list must hold >= 2 non-decreasing quantiles in [0, {MAX_MS:g}] "
                                               "(ms), e.g. [0.0, 0.05, 1.2]")
        return
    ok = isinstance(ad, int | float) and not isinstance(ad, bool) and math.isfinite(ad) and 0 <= ad <= MAX_MS
    if not ok:  # a time: at most MAX_MS (dvasim.schema)
        raise ConfigError(f"{name}.{key}", f"must be a number in [0, {MAX_MS:g}] (ms) or a list of quantiles, "
                                           f"got {ad!r}")
    section[key] = float(ad)
