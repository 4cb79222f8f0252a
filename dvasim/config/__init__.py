"""TOML configs: loading, ``--set`` overrides, validation with one-line errors naming the field.

Sections and keys::

    [model]     table = "path.csv"            # a latency table (stage,batch_size,latency_ms[,seq_len])
                or name = "bert_base", device = "titanrtx" | "a100" | "h100" | "cpu", stages = 4
    [policy]    name = "delaybatch"           # any registered policy; its other keys are its parameters
    [workload]  kind = "poisson" | "uniform" | "explicit" | "stepping", ...   (see dvasim.workload)
    [qos]       target_ms = 200, warmup_fraction = 0.0   # share of the first queries the stability verdict skips
    [engine]    buffer_pairs = 2, sharing = "fluid" | "exclusive" | "parallel" | "cores", cores = 2,
                corun_slowdown = 1.0, launch_overhead_ms = 0.0, admission_delay_ms = 0.0,
                service_cv = 0.0, progress = false
    [replay]    modules = "auto" | "cudagraph" | "torchscript" | "eager"   # how `dvasim replay` runs the stages
    [server]    stack = "triton-tensorrt" | "tfserving" | "gpu-only" | ...    # the serving stack (dvasim.server);
                its other keys override the stack's numbers

Relative paths are looked up next to the config file, then in the working directory, then in the project root
(where the shipped ``traces/`` live).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import tomllib

from dvasim.errors import ConfigError
from dvasim.paths import DATA_ROOT, PROJECT_ROOT  # noqa: F401  (PROJECT_ROOT: kept for importers)
from dvasim.schema import check_keys, check_number, find_file  # noqa: F401  (importers use them from here)

SECTIONS = ("model", "policy", "workload", "qos", "engine", "replay", "server")

DEFAULTS: dict[str, dict[str, Any]] = {
    "model": {},
    "policy": {"name": "zerobatch"},
    "workload": {},
    "qos": {"target_ms": 200.0, "warmup_fraction": 0.0},
    "engine": {
        "buffer_pairs": 2,
        "instances": 1,
        "sharing": "fluid",
        "corun_slowdown": 1.0,
        "cores": 2,
        "launch_overhead_ms": 0.0,
        "admission_delay_ms": 0.0,
        "service_cv": 0.0,
        "progress": False,
    },
    "replay": {"modules": "auto"},
    "server": {},
}

ENGINE_KEYS = {
    "buffer_pairs": "number of buffer pairs (1 = serial manner)",
    "instances": "model instances: parallel chains of stage executors sharing the device",
    "sharing": "device-sharing model: fluid, exclusive, parallel or cores",
    "corun_slowdown": "rate divisor while two or more executions overlap (>= 1)",
    "cores": 'CPU cores for sharing = "cores" (each execution takes one)',
    "launch_overhead_ms": "host-side scheduling cost added to every stage launch",
    "admission_delay_ms": "time from a query's arrival until the front door sees it (receiving thread wake-up): "
                          "a constant, or a list of quantiles of its distribution",
    "service_cv": "run-to-run jitter of execution times: coefficient of variation of a mean-1 log-normal factor",
    "progress": "show a progress bar",
    "host": "[engine.host]: the host of a GPU run (launch costs, launching cores, interpreter lock); "
            "see dvasim.server.host",
    "transfer": "[engine.transfer]: host-to-GPU input copies (mode = \"none\" | \"pool\" | \"on_launch\", "
                "input_bytes, input_bytes_per_token, bandwidth_gbps); see dvasim.server.transfer",
}
QOS_KEYS = {"target_ms": "latency target for the QoS violation rate",
            "warmup_fraction": "share of the first queries (by arrival) left out of the stability verdict, in [0, 1)"}
REPLAY_KEYS = {"modules": 'how the replay runs the stage modules: "auto" (CUDA graphs on a GPU, TorchScript on a '
                          'CPU), "cudagraph", "torchscript" (traced and frozen) or "eager"'}


# sizes a run can hold: every buffer pair and instance is state the engine keeps (and a real GPU memory)
MAX_BUFFER_PAIRS = 64
MAX_INSTANCES = 64
MAX_CORES = 4096


def _count(eng: dict[str, Any], key: str, limit: int) -> None:
    v = eng[key]
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= limit:
        raise ConfigError(f"engine.{key}", f"must be an integer in 1..{limit}, got {v!r}")


def load_toml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file() and not p.is_absolute() and (DATA_ROOT / p).is_file():
        p = DATA_ROOT / p  # a shipped config (configs/...), from any working directory
    if not p.is_file():
        raise ConfigError("config", f"file {str(p)!r} not found; give the path of a TOML config")
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError("config", f"{p}: not UTF-8 text (byte {e.start}); save the config as UTF-8") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("config", f"{p}: not valid TOML ({e})") from None
    except RecursionError:
        raise ConfigError("config", f"{p}: nested too deeply to read; flatten its tables and arrays") from None
    data.setdefault("_base_dir", str(p.resolve().parent))
    return data


def apply_engine_file(raw: dict[str, Any], path: str | Path | None) -> dict[str, Any]:
    """Merge the ``[engine]`` section of ``path`` (e.g. written by ``dvasim fit``) over the config's engine.

    Keys of the file win; ``[engine.host]`` is merged key by key. A relative ``launch_table`` in the file is
    taken relative to the file."""
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
    extra = sorted(k for k in data if k not in ("engine", "fit"))
    if extra:
        raise ConfigError("--engine", f"{path}: only [engine] (and [fit] notes) may be in an engine file, "
                                      f"found [{extra[0]}]")
    eng = copy.deepcopy(eng)
    host = eng.get("host")
    if isinstance(host, dict) and isinstance(host.get("launch_table"), str):
        host["launch_table"] = str(find_file(host["launch_table"], base, "engine.host.launch_table"))
    raw = copy.deepcopy(raw)
    merged = {**raw.get("engine", {}), **eng}
    if isinstance(raw.get("engine", {}).get("host"), dict) and isinstance(host, dict):
        merged["host"] = {**raw["engine"]["host"], **host}
    raw["engine"] = merged
    return raw


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
    change of its shape: another workload kind, another policy with its own parameters) or unset a key."""
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
        if section == "engine" and key.startswith(("host.", "transfer.")):  # a key of [engine.host] / [.transfer]
            sub, key = key.split(".", 1)
            table = table.setdefault(sub, {})
            if not isinstance(table, dict):
                raise ConfigError(f"engine.{sub}", f"must be a table of keys ([engine.{sub}]), see dvasim.engines.sim.{sub}")
        if value is UNSET:
            table.pop(key, None)
        else:
            table[key] = value
    return raw


def resolve(raw: dict[str, Any] | str | Path, overrides: list[str] | None = None,
            engine: str | Path | None = None) -> dict[str, Any]:
    """Return the config with defaults filled in and every section checked (policy/workload keys are checked
    by the policy and workload builders). ``engine``: an engine file (``dvasim fit``) merged over ``[engine]``
    before the overrides."""
    if isinstance(raw, (str, Path)):
        raw = load_toml(raw)
    raw = apply_engine_file(raw, engine)
    raw = apply_overrides(raw, overrides)
    base_dir = raw.pop("_base_dir", None) or raw.pop("base_dir", None)
    for section in raw:
        if section not in SECTIONS:
            raise ConfigError(section, f"unknown section [{section}]; allowed: {', '.join(SECTIONS)}")
        if not isinstance(raw[section], dict):
            raise ConfigError(section, f"[{section}] must be a table of keys")
    cfg = {s: {**DEFAULTS[s], **raw.get(s, {})} for s in SECTIONS}
    cfg["base_dir"] = base_dir or str(Path.cwd())
    from dvasim.model.catalog import KEYS as MODEL_KEYS

    check_keys("model", cfg["model"], MODEL_KEYS)
    check_keys("engine", cfg["engine"], ENGINE_KEYS)
    check_keys("qos", cfg["qos"], QOS_KEYS)
    check_keys("replay", cfg["replay"], REPLAY_KEYS)
    if cfg["replay"]["modules"] not in ("auto", "cudagraph", "torchscript", "eager"):
        raise ConfigError("replay.modules", 'must be "auto", "cudagraph", "torchscript" or "eager", got '
                                            f'{cfg["replay"]["modules"]!r}')
    if "table" in cfg["model"]:
        cfg["model"]["table"] = str(find_file(cfg["model"]["table"], base_dir, "model.table"))
    elif "name" not in cfg["model"]:
        raise ConfigError("model", 'missing; set table = "path/to/latency.csv" or name = "bert_base", '
                                   'device = "titanrtx", stages = 4')
    if not cfg["workload"]:
        raise ConfigError("workload", 'missing section; e.g. [workload] kind = "poisson", rate_qps = 100, n_queries = 1000')
    eng = cfg["engine"]
    _count(eng, "buffer_pairs", MAX_BUFFER_PAIRS)
    _count(eng, "cores", MAX_CORES)
    _count(eng, "instances", MAX_INSTANCES)
    from dvasim.engines.sim.device import MODES

    if eng["sharing"] not in MODES:
        raise ConfigError("engine.sharing", f"unknown mode {eng['sharing']!r}; allowed: {', '.join(MODES)}")
    check_number(eng, "engine", "corun_slowdown", minimum=1.0)
    check_number(eng, "engine", "launch_overhead_ms", minimum=0.0)
    ad = eng["admission_delay_ms"]
    if isinstance(ad, list):
        if (len(ad) < 2 or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                                   and x >= 0 for x in ad) or any(b < a for a, b in zip(ad, ad[1:]))):
            raise ConfigError("engine.admission_delay_ms", "a list must hold >= 2 non-decreasing quantiles >= 0 (ms), "
                                                           "e.g. [0.0, 0.05, 1.2]")
    else:
        check_number(eng, "engine", "admission_delay_ms", minimum=0.0)
    check_number(eng, "engine", "service_cv", minimum=0.0)
    if "host" in eng and not isinstance(eng["host"], dict):
        raise ConfigError("engine.host", "must be a table of keys ([engine.host]), see dvasim.server.host")
    if "transfer" in eng:
        from dvasim.server.transfer import transfer_from_config

        transfer_from_config(eng["transfer"])  # checked here: one line naming the key
    if not isinstance(eng["progress"], bool):
        raise ConfigError("engine.progress", f"must be true or false, got {eng['progress']!r}")
    check_number(cfg["qos"], "qos", "target_ms", minimum=0.0, strict=True)
    wf = cfg["qos"]["warmup_fraction"]
    if isinstance(wf, bool) or not isinstance(wf, (int, float)) or not 0 <= wf < 1:
        raise ConfigError("qos.warmup_fraction", f"must be a number in [0, 1) (share of the queries), got {wf!r}")
    cfg["qos"]["warmup_fraction"] = float(wf)
    from dvasim.server.resolve import check_server

    check_server(cfg["server"])
    if not isinstance(cfg["policy"].get("name"), str):
        raise ConfigError("policy.name", "must be a string naming a policy")
    return cfg
