"""Reading a config: the TOML file (a shipped one found from any directory) and an engine file merged over its
``[engine]`` (with the choices it pins, :mod:`dvasim.config.pins`). May import the foundation (:mod:`dvasim.errors`,
:mod:`dvasim.paths`, :mod:`dvasim.schema`) and :mod:`dvasim.config.pins`."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import tomllib

from dvasim.config.pins import apply_pins, check_pins, refuse_contradictions
from dvasim.errors import ConfigError
from dvasim.paths import DATA_ROOT
from dvasim.schema import find_file


def load_toml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        if not p.is_file() and not p.is_absolute() and (DATA_ROOT / p).is_file():
            p = DATA_ROOT / p  # a shipped config (configs/...), from any working directory
        if not p.is_file():
            raise ConfigError("config", f"file {str(p)[:200]!r} not found; give the path of a TOML config")
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError("config", f"{p}: not UTF-8 text (byte {e.start}); save the config as UTF-8") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("config", f"{p}: not valid TOML ({e})") from None
    except RecursionError:
        raise ConfigError("config", f"{p}: nested too deeply to read; flatten its tables and arrays") from None
    except OSError as e:  # a name too long, a folder, no permission
        raise ConfigError("config", f"cannot read {str(p)[:200]!r} ({e.strerror or e}); give the path of a TOML "
                                    "config") from None
    data.setdefault("_base_dir", str(p.resolve().parent))
    return data


def apply_engine_file(raw: dict[str, Any], path: str | Path | None) -> dict[str, Any]:
    """Merge the ``[engine]`` section of ``path`` (e.g. written by ``dvasim fit``) over the config's engine.

    Keys of the file win; ``[engine.host]`` is merged key by key. A relative ``launch_table`` or ``gpu_table`` in
    the file is taken relative to the file. The file's ``[pinned]`` choices (:mod:`dvasim.config.pins`: what it
    was fitted under) apply where the config leaves them unset; a config that sets one otherwise is refused."""
    if path is None:
        return raw
    try:
        data = load_toml(path)
    except ConfigError as e:
        raise ConfigError("--engine", e.message) from None
    base = data.pop("_base_dir")
    eng = data.get("engine")
    if not isinstance(eng, dict) or not eng:
        raise ConfigError("--engine", f"{path}: has no [engine] section; give a file written by dvasim fit")
    extra = sorted(k for k in data if k not in ("engine", "fit", "pinned"))
    if extra:
        raise ConfigError("--engine", f"{path}: only [engine] (with its [pinned] choices and [fit] notes) may be in "
                                      f"an engine file, found [{extra[0]}]")
    pins = check_pins(data["pinned"], path) if "pinned" in data else None
    if pins:
        refuse_contradictions(raw, pins, path)
    eng = copy.deepcopy(eng)
    host = eng.get("host")
    for key in ("launch_table", "gpu_table"):  # relative to the file (dvasim fit writes them so)
        if isinstance(host, dict) and isinstance(host.get(key), str):
            host[key] = str(find_file(host[key], base, f"engine.host.{key}"))
    raw = copy.deepcopy(raw)
    merged = {**raw.get("engine", {}), **eng}
    if isinstance(raw.get("engine", {}).get("host"), dict) and isinstance(host, dict):
        merged["host"] = {**raw["engine"]["host"], **host}
    raw["engine"] = merged
    return apply_pins(raw, pins, path) if pins else raw
