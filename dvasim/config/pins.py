"""An engine file's pinned choices (its ``[pinned]`` table, issue 46): the modelling choices, outside its fitted
numbers, that the numbers were fitted under, so that a later dvasim whose defaults moved reproduces the file or
refuses it in one line.

``dvasim fit`` writes them (:func:`dvasim.fitting.fit.fitted_pins`); :func:`dvasim.config.files.apply_engine_file`
applies them to the config a run is given:

* ``[pinned.policy]`` ``cluster_host_cost``: whether DVABatch's Policy I counts the serving stack's host work in a
  cluster's cost. A replay's policy decides on the GPU's time alone (false; the default became true after the H100
  replays were recorded). Applied to a policy that takes the parameter;
* ``[pinned.engine.host]`` ``copy_lock`` (what of a copy holds the interpreter lock; the default moved from "all"
  to "fixed" on 2026-11-28) and ``launch_scale`` (1 where the launch law, not a launch table, was fitted);
* ``[pinned.model]`` ``name``, ``cuts``, ``operators``: the cut of the model the launch law was fitted through
  (the first operator of each stage) and the model's operators then. A run of that zoo model that gives no cut of
  its own (no ``cuts``, ``ratios`` or ``table``; ``stages`` absent or the cut's count) runs at that cut, not at
  wherever today's time-even slicing puts ``stages`` (it moved for the H100 replays); a run at any other cut or
  stage count uses the launch law, which serves any slicing. A zoo that counts the model's operators otherwise
  than ``operators`` is refused: the law's per-operator cost would not mean the same.

A config that does not set a pinned key gets the pinned value; one that sets another value is refused (a
:class:`~dvasim.errors.ConfigError` naming the key: the command line prints one line and exits 2); a ``[pinned]``
key this dvasim does not know is refused too. ``--set`` overrides come after the engine file and still win, as
over its other keys. Engine files without ``[pinned]`` (written before issue 46) are merged as before.
"""

from __future__ import annotations

import copy
from typing import Any

from dvasim.errors import ConfigError

PINNABLE = {"policy": ("cluster_host_cost",), "engine.host": ("copy_lock", "launch_scale"),
            "model": ("name", "cuts", "operators")}


def check_pins(pinned: Any, path) -> dict[str, dict[str, Any]]:
    """The ``[pinned]`` table flattened to ``{"policy": {...}, "engine.host": {...}, "model": {...}}``, every key
    one this dvasim knows (else one line naming it)."""
    if not isinstance(pinned, dict):
        raise ConfigError("--engine", f"{path}: [pinned] must be a table of the choices the file was fitted under")
    flat: dict[str, dict[str, Any]] = {}
    for section, keys in pinned.items():
        if section == "engine" and isinstance(keys, dict):
            for sub, vals in keys.items():
                _add(flat, f"engine.{sub}", vals, path)
        else:
            _add(flat, section, keys, path)
    model = flat.get("model")
    if model is not None and sorted(model) != sorted(PINNABLE["model"]):
        raise ConfigError("--engine", f"{path}: [pinned.model] must give name, cuts and operators together")
    return flat


def _add(flat: dict, section: str, vals: Any, path) -> None:
    if section not in PINNABLE or not isinstance(vals, dict):
        raise ConfigError("--engine", f"{path}: [pinned.{section}] is not a choice this dvasim can pin (it pins "
                                      f"{', '.join(PINNABLE)}); use the dvasim that wrote the file, or refit")
    unknown = [k for k in vals if k not in PINNABLE[section]]
    if unknown:
        raise ConfigError("--engine", f"{path}: [pinned.{section}] {unknown[0]} is not a choice this dvasim can "
                                      "pin; use the dvasim that wrote the file, or refit")
    flat[section] = dict(vals)


def _section(raw: dict, dotted: str) -> dict | None:
    d: Any = raw
    for part in dotted.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d if isinstance(d, dict) else None


def refuse_contradictions(raw: dict[str, Any], flat: dict[str, dict[str, Any]], path) -> None:
    """One line naming the first key that the config sets otherwise than the engine file pins it."""
    for section in ("policy", "engine.host"):
        given = _section(raw, section) or {}
        for key, value in flat.get(section, {}).items():
            if key in given and given[key] != value:
                raise ConfigError(f"{section}.{key}", f"is {given[key]!r}, but the engine file {path} was fitted "
                                                      f"under {key} = {value!r} (its [pinned]); drop the key from "
                                                      "the config to run under the file's choice, or refit")


def apply_pins(raw: dict[str, Any], flat: dict[str, dict[str, Any]], path) -> dict[str, Any]:
    """``raw`` (the config with the engine file merged) with every pinned choice it leaves unset applied."""
    raw = copy.deepcopy(raw)
    policy = flat.get("policy")
    if policy and _takes(raw.get("policy"), policy):
        sec = raw.setdefault("policy", {})
        for key, value in policy.items():
            sec.setdefault(key, value)
    host = flat.get("engine.host")
    if host:
        eng = raw.setdefault("engine", {})
        if not isinstance(eng.get("host"), dict):
            eng["host"] = {}
        for key, value in host.items():
            if key in eng["host"] and eng["host"][key] != value:  # the file's own [engine.host] says otherwise
                raise ConfigError("--engine", f"{path}: [engine.host] {key} = {eng['host'][key]!r} but [pinned] "
                                              f"says {value!r}; refit")
            eng["host"].setdefault(key, value)
    if flat.get("model"):
        _apply_cut(raw, flat["model"], path)
    return raw


def _takes(policy: Any, pins: dict[str, Any]) -> bool:
    """Whether the config's policy (``zerobatch`` when unnamed) takes the pinned parameters."""
    from dvasim.policies.base import _REGISTRY, canonical_name

    name = policy.get("name", "zerobatch") if isinstance(policy, dict) else "zerobatch"
    if not isinstance(name, str) or (isinstance(policy, dict) and "triton_config" in policy):
        return False
    cls = _REGISTRY.get(canonical_name(name))
    return cls is not None and all(k in cls.params for k in pins)


def _apply_cut(raw: dict[str, Any], pin: dict[str, Any], path) -> None:
    """The fitted cut for a run of the pinned zoo model that gives no cut of its own (see the module docstring)."""
    model = raw.get("model")
    if not isinstance(model, dict) or model.get("name") != pin["name"]:
        return
    if any(k in model for k in ("table", "cuts", "ratios")):
        return
    cuts = [int(c) for c in pin["cuts"]]
    if model.get("stages", len(cuts)) != len(cuts):
        return
    counted = zoo_operators({**{k: v for k, v in model.items() if k != "stages"}, "cuts": cuts})
    if counted != int(pin["operators"]):
        zoo = "cannot cut it there" if counted is None else f"counts {counted}"
        raise ConfigError("model.cuts", f"the engine file {path} was fitted through {pin['name']}'s cut {cuts} of "
                                        f"{pin['operators']} operators (its [pinned.model]); this dvasim's zoo "
                                        f"{zoo}: give [model] cuts of this zoo and refit the engine")
    raw["model"] = {**{k: v for k, v in model.items() if k != "stages"}, "cuts": cuts}


def zoo_operators(model_cfg: dict[str, Any]) -> int | None:
    """The operators this dvasim's zoo counts in the model of ``model_cfg`` (``None`` where it cannot resolve it,
    e.g. cuts beyond its operators: the run's own error then says why)."""
    from dvasim.errors import DvasimError
    from dvasim.model.catalog import resolve_model
    from dvasim.server.resolve import stage_operators

    try:
        ops, _ = stage_operators(resolve_model(dict(model_cfg)))
    except DvasimError:
        return None
    return int(sum(ops))
