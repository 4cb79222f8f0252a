"""Which stack a run serves on, and what the engine gets from it.

Precedence:

1. ``[server] stack = NAME`` (or ``--stack NAME``, ``dvasim.run(..., stack=NAME)``): that stack, its fields
   overridden by the other keys of ``[server]``;
2. else an ``[engine.host]`` table (a hand-written host, or an engine file from ``dvasim fit`` given with
   ``--engine``): the stack ``custom``, no per-batch costs beside what ``[engine.host]`` says;
3. else the stack the table's source implies (:func:`implied_stack`): the Titan RTX and A100 tables model
   TensorRT's fused kernels (``triton-tensorrt``), the H100 tables were fitted to CUDA-graph replays
   (``cudagraph``), the CPU tables are measured stage times (``as-profiled``); a table file names its stack in a
   ``# stack:`` provenance line, else it is ``as-profiled``.

An explicit ``[engine.host]`` under a named stack replaces that stack's launch model (launches, copies, Python-level
work, cores) as a whole; the stack keeps its per-batch costs, except the inputs' gathering and copy where the
``[engine.host]`` measured them itself (``first_copy_ms`` / ``first_copy_per_row_ms``, as ``dvasim fit`` writes).

A launch cost per operator needs the operators in each stage: a table that gives none (no ``# operators:`` line) is
refused under such a stack, rather than launching one operator a stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dvasim.errors import ConfigError
from dvasim.schema import MAX_FACTOR, Key, Section
from dvasim.server.costs import BatchCosts, model_io
from dvasim.server.stacks import BOOL_FIELDS, FIELD_HELP, MODULE_KINDS, RELEASE_FIELDS, STACKS, ServingStack


def _field_key(name: str, help_: str) -> Key:
    """The [server] key that overrides the stack's number ``name`` (its help, type and range)."""
    if name in BOOL_FIELDS:
        return Key(name, "bool", help_)
    if name == "modules":
        return Key(name, "choice", help_, choices=MODULE_KINDS)
    if name == "triton_release":
        from dvasim.policies.triton_release import RELEASES

        return Key(name, "choice", help_, choices=RELEASES)
    if name.endswith("_gbps"):
        return Key(name, "number", help_ + " (GB/s; inf = free)", minimum=0, strict=True, allow_inf=True)
    if name == "host_cores":
        return Key(name, "number", help_, minimum=1)
    if name == "corun_per_worker":  # a slowdown: at most MAX_FACTOR (dvasim.schema)
        return Key(name, "number", help_, minimum=0, maximum=MAX_FACTOR)
    return Key(name, "number", help_, minimum=0)


SERVER = Section("server", "the serving stack around the GPU (dvasim stacks); its other keys override the stack's "
                           "numbers", (
    Key("stack", "choice", "the serving stack (default: the one the table's source implies)", choices=tuple(STACKS)),
    *(_field_key(k, h) for k, h in FIELD_HELP.items()),
))

# the device of a named model's table -> the stack its source implies, and why
DEVICE_STACKS = {
    "titanrtx": ("triton-tensorrt-21.10", "the Titan RTX tables model TensorRT's fused kernels (fusion=tensorrt), "
                                          "the DVABatch paper's Triton 21.10 + TensorRT (Table 1)"),
    "a100": ("triton-tensorrt", "the A100 tables model TensorRT's fused kernels (fusion=tensorrt), as served by "
                                "Triton in the characterization study"),
    "h100": ("cudagraph", "the H100 tables were fitted to GPU time of stages captured as CUDA graphs"),
    "cpu": ("as-profiled", "the CPU tables are measured stage times on this machine, the host's work included"),
}


@dataclass
class StackRun:
    """A run's stack and what the engine needs from it."""

    stack: ServingStack
    source: str  # why this stack: "config", "engine.host", or the table's implication
    reason: str = ""  # why, in a few words, as every command prints it (stack_reason): "implied by device h100"
    host: Any = None  # a HostModel, or None (no host model)
    batch: BatchCosts | None = None
    operators: list[int] | None = None
    operators_source: str = ""

    @property
    def label(self) -> str:
        """The stack's name, and the Triton release where the config set one the stack does not run by itself."""
        st = self.stack
        own = STACKS[st.name].triton_release if st.name in STACKS else "ideal"
        return st.name if st.triton_release == own else f"{st.name} (triton {st.triton_release})"

    @property
    def triton_release(self) -> str:
        return self.stack.triton_release

    @property
    def corun_per_worker(self) -> float:
        return self.stack.corun_per_worker

    def describe(self) -> dict[str, Any]:
        out = {**self.stack.describe(), "source": self.source}
        if self.operators is not None:
            out.update(operators=self.operators, operators_source=self.operators_source)
        if self.batch is not None:
            out.update(input_bytes=self.batch.input_bytes, input_bytes_per_token=self.batch.input_bytes_per_token,
                       output_bytes=self.batch.output_bytes, copy_inputs=self.batch.copy_inputs)
        return out


def stack_by_name(name: Any, field: str = "server.stack") -> ServingStack:
    """A named stack (:data:`STACKS`), or a stack file (a path ending in ``.toml``: ``dvasim fit`` writes them)."""
    if isinstance(name, str) and name.endswith(".toml") and name not in STACKS:
        from pathlib import Path

        from dvasim.server.stacks import stack_from_toml

        p = Path(name)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(field, f"cannot read the stack file {p} ({e.strerror or e}); give a named stack "
                                     "(dvasim stacks) or a file dvasim fit wrote") from None
        return stack_from_toml(text, str(p), field)
    if not isinstance(name, str) or name not in STACKS:
        raise ConfigError(field, f"unknown stack {name!r}; allowed: {', '.join(STACKS)} "
                                 "(`dvasim stacks` lists them with their numbers)")
    return STACKS[name]


def check_server(section: Any) -> dict[str, Any]:
    """The ``[server]`` table checked: the stack's name and typed overrides (one-line errors naming the key)."""
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise ConfigError("server", 'must be a table of keys, e.g. [server] stack = "triton-tensorrt"')
    return SERVER.check(section)


NAMED_BY_TABLE = "the table's provenance names it ('# stack:')"


def stack_reason(source: str, model=None, stack_arg: bool = False) -> str:
    """Why a run serves on its stack, in a few words (``summary["stack_source"]``; every command prints it as
    ``stack: NAME (REASON)``): ``set by --stack``, ``set in [server] stack``, ``implied by [engine.host] (an engine
    file or a hand-written host)``, ``implied by device h100``, ``named by the table's '# stack:' line``, or
    ``default: the table names no stack``."""
    if source == "config":
        return "set by --stack" if stack_arg else "set in [server] stack"
    if source == "engine.host":
        return "implied by [engine.host] (an engine file or a hand-written host)"
    device = getattr(model, "device", None)
    if device in DEVICE_STACKS:
        return f"implied by device {device}"
    if source.endswith(NAMED_BY_TABLE):
        return "named by the table's '# stack:' line"
    return "default: the table names no stack"


def stack_line(name, reason) -> str:
    """The line every command that simulates prints about its serving stack: ``stack: NAME (WHY)``, e.g. ``stack:
    cudagraph (implied by device h100)`` (:func:`stack_reason`)."""
    return f"stack: {name} ({reason})" if reason else f"stack: {name}"


def implied_stack(model) -> tuple[str, str]:
    """The stack a resolved model's table implies, and why (see the module docstring)."""
    if getattr(model, "device", None) in DEVICE_STACKS:
        return DEVICE_STACKS[model.device]
    prov = getattr(model.table, "provenance", {}) or {}
    named = prov.get("stack", "").strip()
    if named:
        if named not in STACKS:
            raise ConfigError("model.table", f"its provenance names stack {named!r}, which is not one of "
                                             f"{', '.join(STACKS)}; fix the '# stack:' line")
        return named, NAMED_BY_TABLE
    return "as-profiled", "the table's source names no serving stack ('# stack:' line): its times are taken as they are"


def stage_operators(model) -> tuple[list[int], str]:
    """Operators in each stage: from a named model's cut bounds; from a table's provenance (``# operators:`` with
    one count per stage, or the model's total -- ``# operators:`` as ``dvasim profile`` writes it, or the zoo
    table's ``# op_names:`` -- with its cuts (``# cuts:``, :attr:`LatencyTable.cuts`)); else one per stage (said so)."""
    table = model.table
    n = table.n_stages
    bounds = getattr(model, "bounds", None)
    op_table = getattr(model, "op_table", None)
    if bounds is not None and op_table is not None and len(bounds) == n:
        ends = [*bounds[1:], op_table.n_stages]
        return [e - b for b, e in zip(bounds, ends)], "the zoo's operators in each stage (the model's cuts)"
    prov = getattr(table, "provenance", {}) or {}
    text = prov.get("operators", "").strip()
    names = prov.get("op_names", "").split()
    if not text and not names:
        return [1] * n, "unknown (no '# operators:' line): one operator per stage assumed"
    try:
        ops = [int(x) for x in text.replace(";", ",").split(",") if x.strip()] if text else [len(names)]
    except ValueError:
        ops = []
    where = "'# operators:'" if text else "'# op_names:'"
    cuts = list(getattr(table, "cuts", None) or [])
    if len(ops) == 1 and len(cuts) == n and cuts[0] == 0 and ops[0] > cuts[-1]:
        ends = [*cuts[1:], ops[0]]
        return [e - b for b, e in zip(cuts, ends)], f"the table's {where} total and its cuts"
    if len(ops) != n or min(ops) < 1:
        raise ConfigError("model.table", f"its '# operators:' line must give {n} counts >= 1 (one per stage), or the "
                                         f"model's total with a '# cuts:' line; got {text!r}")
    return ops, f"the table's {where} line"


def stack_run(name: str, table, transfer=None, field: str = "server.stack") -> StackRun:
    """The :class:`StackRun` of the stack called ``name`` on a bare stage table (operators from its provenance), as
    a run on that table would resolve it (``transfer``: the run's input-copy model, e.g. E2bird's memory pool)."""
    from types import SimpleNamespace

    model = SimpleNamespace(table=table, name=None, bounds=None, op_table=None)
    stack_by_name(name, field)  # checked, naming ``field``
    return resolve_stack({"engine": {}}, model, transfer, stack=name)


def _need_operators(host: dict, ops_src: str) -> None:
    """A launch cost per operator on a table that gives no operators is refused (see the module docstring)."""
    per_op = host.get("launch_per_op_ms", 0.0)
    if isinstance(per_op, (int, float)) and per_op > 0 and ops_src.startswith("unknown"):
        raise ConfigError("model.table", "the launch cost is per operator (launch_per_op_ms) but this table gives no "
                                         "operators; add a '# operators: a,b,c' line (one count per stage) to it, or "
                                         "name the model ([model] name = ...)")


def resolve_stack(cfg: dict[str, Any], model, transfer=None, stack: str | None = None) -> StackRun:
    """The :class:`StackRun` of a resolved config and its resolved model (see the module docstring)."""
    from dvasim.server.host import host_from_config

    server = check_server(cfg.get("server"))
    name = stack if stack is not None else server.get("stack")
    eng_host = cfg["engine"].get("host")
    overrides = {k: v for k, v in server.items() if k != "stack"}
    if name is not None:
        base, source = stack_by_name(name, "--stack" if stack is not None else "server.stack"), "config"
    elif eng_host:
        base = ServingStack("custom", "a host given as [engine.host] (hand-written, or an engine file from "
                                      "dvasim fit): its launch model, no per-batch costs beside it",
                            adds_nothing=True, sources={"all": "the config's [engine.host]"})
        source = "engine.host"
    else:
        implied, why = implied_stack(model)
        base, source = STACKS[implied], f"implied by the table: {why}"
    st = base.with_overrides(overrides)
    costs = [k for k in overrides if k not in RELEASE_FIELDS]
    if costs and st.adds_nothing:
        raise ConfigError(f"server.{costs[0]}", f"the stack {st.name!r} adds no host cost; name a stack "
                                                             "with one ([server] stack = ...) to set its costs")
    n = model.table.n_stages
    ops, ops_src = stage_operators(model)
    run = StackRun(st, source, stack_reason(source, model, stack is not None))
    base_dir = cfg.get("base_dir")
    if st.adds_nothing:
        if eng_host:
            _need_operators(eng_host, ops_src)
        run.host = host_from_config(eng_host, n, base_dir, operators=ops)
        if run.host is not None:
            run.operators, run.operators_source = ops, ops_src
        return run
    run.operators, run.operators_source = ops, ops_src
    if isinstance(eng_host, dict) and eng_host:
        host = dict(eng_host)
    else:
        host = {"modules": st.modules, "cores": st.host_cores, "launch_fixed_ms": st.launch_fixed_ms,
                "launch_per_op_ms": st.launch_per_op_ms, "launch_model_per_row_ms": st.launch_per_row_ms,
                "python_ms": st.python_ms if st.interpreter_lock else 0.0}
    _need_operators(host, ops_src)
    run.host = host_from_config(host, n, base_dir, operators=ops)
    measured_inputs = isinstance(eng_host, dict) and any(k in eng_host for k in ("first_copy_ms",
                                                                                  "first_copy_per_row_ms"))
    (i_b, i_tok, o_b), _why = model_io(getattr(model, "name", None) or model.table.name)
    run.batch = BatchCosts(
        request_ms=st.request_ms, request_per_row_ms=st.request_per_row_ms, gather_per_row_ms=st.gather_per_row_ms,
        gather_gbps=st.gather_gbps, h2d_gbps=st.h2d_gbps, d2h_gbps=st.d2h_gbps, sync_ms=st.sync_ms,
        idle_between_batches=st.idle_between_batches, input_bytes=i_b, input_bytes_per_token=i_tok,
        output_bytes=o_b, copy_inputs=transfer is None and not measured_inputs, python_level=st.interpreter_lock,
        gather_inputs=(transfer is None or transfer.mode != "pool") and not measured_inputs)
    return run
