"""Named models in configs: ``[model] name = "bert_base", device = "titanrtx", stages = 4``.

The shipped per-operator tables are sliced on demand, so any stage count from 1 to the number of operators works:

* ``device = "titanrtx" | "a100" | "h100"``: the six full models, per-operator latencies from the analytic GPU
  model (``traces/gpu/<device>/<name>.csv``, labelled as modelled);
* ``device = "cpu"``: the small variants, measured on this machine's CPU (``traces/cpu/<name>_small_ops.csv``),
  the tables the replay is checked against.

Slicing (``dvasim.model.slicing``): ``stages = N`` cuts time-evenly (the paper's default) at the reference
batch size ``slice_batch_size`` (default 1); ``cuts = [i, j, ...]`` cuts before the given operator indices;
``ratios = [...]`` cuts at fractions of the total time. A ``table = "file.csv"`` instead of a name uses that
per-stage table as it is.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dvasim.errors import ConfigError
from dvasim.schema import Key, Section

DEVICES = ("titanrtx", "a100", "h100", "cpu")
MODEL_NAMES = ("bert_base", "bert_large", "resnet152", "vgg19", "unet", "linknet")
MODEL = Section("model", "the model served: a latency table, or a model of the zoo cut into stages", (
    Key("table", "path", "a per-stage latency table CSV (stage,batch_size,latency_ms[,seq_len]), instead of "
        "name/device/stages"),
    Key("name", "choice", "a model of the zoo", choices=MODEL_NAMES),
    Key("device", "choice", "whose latencies", default="titanrtx", choices=DEVICES),
    Key("stages", "int", "number of stages, cut time-evenly (1 .. the model's operators)", default=4, minimum=1),
    Key("cuts", "ints", "operator indices where stages begin (instead of stages)", minimum=0),
    Key("ratios", "numbers", "fractions of the total time at which to cut (instead of stages)"),
    Key("slice_batch_size", "int", "batch size whose operator times decide the slicing", default=1, minimum=1),
))


def traces_root() -> Path:
    from dvasim.model.table import traces_dir

    return Path(traces_dir())


@dataclass
class ResolvedModel:
    table: Any  # LatencyTable (per stage)
    name: str | None = None
    device: str | None = None
    variant: str | None = None
    bounds: list[int] | None = None  # first operator index of each stage
    op_table: Any = None
    info: dict = field(default_factory=dict)


def op_table_path(name: str, device: str) -> Path:
    root = traces_root()
    return root / "cpu" / f"{name}_small_ops.csv" if device == "cpu" else root / "gpu" / device / f"{name}.csv"


@functools.lru_cache(maxsize=32)
def load_op_table(name: str, device: str):
    from dvasim.model.table import LatencyTable

    path = op_table_path(name, device)
    if not path.is_file():
        raise ConfigError("model.name", f"no shipped table for {name!r} on {device!r} (expected {path})")
    return LatencyTable.load(path)


@functools.lru_cache(maxsize=64)
def _stage_table(name: str, device: str, slice_batch_size: int, how: str, value):
    """The stage table of a named model sliced ``how`` (``n_stages``, ``cuts`` or ``ratios``: ``value``), kept:
    a study builds the same few tables for hundreds of runs, and a table is never changed once built."""
    from dvasim.model.slicing import stage_table

    return stage_table(load_op_table(name, device), at_batch_size=slice_batch_size, name=f"{name}_{device}",
                       **{how: list(value) if isinstance(value, tuple) else value})


def resolve_model(model_cfg: dict[str, Any]) -> ResolvedModel:
    """Build the per-stage table a ``[model]`` section asks for."""
    from dvasim.model.table import LatencyTable

    MODEL.check(model_cfg)  # unknown keys, types and ranges
    if "table" in model_cfg:
        extra = sorted(set(model_cfg) - {"table"})
        if extra:
            raise ConfigError(f"model.{extra[0]}", "give either table = \"file.csv\" or name/device/stages, not both")
        return ResolvedModel(LatencyTable.load(model_cfg["table"]))
    name = model_cfg.get("name")
    if name is None:
        raise ConfigError("model", 'set table = "file.csv", or name = "bert_base" with device and stages')
    if name not in MODEL_NAMES:
        raise ConfigError("model.name", f"unknown model {name!r}; allowed: {', '.join(MODEL_NAMES)}")
    device = model_cfg.get("device", "titanrtx")
    if device not in DEVICES:
        raise ConfigError("model.device", f"unknown device {device!r}; allowed: {', '.join(DEVICES)}")
    given = [k for k in ("stages", "cuts", "ratios") if k in model_cfg]
    if len(given) > 1:
        raise ConfigError(f"model.{given[1]}", "give only one of stages, cuts or ratios")
    op_table = load_op_table(name, device)
    kwargs: dict[str, Any] = {}
    if not given or given[0] == "stages":
        stages = model_cfg.get("stages", 4)
        if isinstance(stages, bool) or not isinstance(stages, int) or not 1 <= stages <= op_table.n_stages:
            raise ConfigError("model.stages", f"must be an integer in 1..{op_table.n_stages} (the operators of "
                                              f"{name}), got {stages!r}")
        kwargs["n_stages"] = stages
    elif given[0] == "cuts":
        cuts = model_cfg["cuts"]
        if not isinstance(cuts, list) or not all(isinstance(c, int) and not isinstance(c, bool) for c in cuts):
            raise ConfigError("model.cuts", f"must be a list of operator indices (integers), e.g. [0, 20, 40]; "
                                            f"got {cuts!r}")
        kwargs["cuts"] = cuts
    else:
        ratios = model_cfg["ratios"]
        if not isinstance(ratios, list) or not all(
                isinstance(r, (int, float)) and not isinstance(r, bool) and math.isfinite(r) for r in ratios):
            raise ConfigError("model.ratios", f"must be a list of numbers, e.g. [0.5, 0.5]; got {ratios!r}")
        kwargs["ratios"] = ratios
    sbs = model_cfg.get("slice_batch_size", 1)
    if isinstance(sbs, bool) or not isinstance(sbs, int) or not 1 <= sbs <= op_table.max_batch_size:
        raise ConfigError("model.slice_batch_size", f"must be an integer batch size in 1..{op_table.max_batch_size} "
                                                    f"(the operator table's), got {sbs!r}")
    (how, value), = kwargs.items()
    table = _stage_table(name, device, sbs, how, tuple(value) if isinstance(value, list) else value)
    bounds = list(table.cuts) if table.cuts is not None else None
    return ResolvedModel(table, name, device, "small" if device == "cpu" else "full", bounds, op_table)
