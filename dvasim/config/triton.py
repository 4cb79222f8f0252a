"""Triton model configurations in: ``[policy] triton_config = "config.pbtxt"`` (or ``dvasim run --triton-config``).

The file is read the way Triton reads it: the protobuf text format, parsed by the protobuf library
(``google.protobuf.text_format``) into Triton's own ``inference.ModelConfig`` message, whose class is built at run
time from the compiled descriptor set shipped in ``dvasim/config/triton/`` (``model_config.binpb``, compiled from
Triton's ``model_config.proto``; its provenance is in ``dvasim/config/triton/PROVENANCE.md``). Every field of a
real config is accepted; a syntax error, an unknown field, a wrong type or a value out of its type's range is one
line naming the file, the line, the column and the field.

What is simulated (:class:`dvasim.policies.triton_server.TritonServerBatcher`, policy ``"triton"``), with Triton's
rules for absent fields:

* ``max_batch_size`` (Triton batches at most ``max(1, max_batch_size)``);
* ``dynamic_batching``: ``preferred_batch_size`` (none: ``[max_batch_size]``, NormalizeModelConfig),
  ``max_queue_delay_microseconds`` (-> ``max_queue_delay_ms``), ``priority_levels``, ``default_priority_level``,
  ``default_queue_policy`` and ``priority_queue_policy`` (``max_queue_size``, ``timeout_action``,
  ``default_timeout_microseconds`` -> ``default_timeout_ms``, ``allow_timeout_override``), checked as Triton's
  ValidateModelConfig checks them (a preferred size in 1..max_batch_size, the default level in
  1..priority_levels, every policy's level in 1..priority_levels);
* no ``dynamic_batching`` (and no other scheduler): Triton's *default scheduler*, which hands every request to
  the next free instance as it came, never batching requests together (docs/user_guide/scheduler.md, "Default
  Scheduler"). Note that Triton may add ``dynamic_batching { }`` to a config itself: backends that auto-complete
  configs (ONNX Runtime, TensorRT) do when ``max_batch_size > 1`` and no scheduler is given, unless Triton runs
  with ``--disable-auto-complete-config`` (model_configuration.md, "Default Max Batch Size and Dynamic
  Batcher"). dvasim simulates the file as written: add ``dynamic_batching { }`` to get the auto-completed one;
* ``instance_group`` -> ``[engine] instances``: the sum of the groups' ``count`` (a group without one: 1, or 2
  for a ``KIND_CPU`` group of the ``onnxruntime`` or ``tensorflow`` backends, SetDefaultInstanceCount), groups
  marked ``passive`` left out (Triton does not schedule requests to them); no group: one instance (Triton makes
  one per GPU, and dvasim simulates one device). Every kind is accepted (``KIND_GPU``, ``KIND_AUTO``,
  ``KIND_CPU``, ``KIND_MODEL``) and served on the device the ``[model]`` table models; groups of CPU and GPU
  kinds together, or groups naming more than one GPU in ``gpus`` (Triton makes ``count`` instances on *each*
  listed GPU), are refused: one device is simulated.

Refused: ``sequence_batching`` and ``ensemble_scheduling`` (other schedulers, not simulated). Read and not
simulated (they do not change when a request is served in the model dvasim runs): the inputs and outputs,
``optimization``, ``preserve_ordering`` (Triton holds a response until the earlier ones are sent), the rate limiter
and the response cache.

**Values given next to the file.** The file sets the whole policy and the instances: a key of ``[policy]``
(other than ``name = "triton"`` and ``triton_config``) or ``[engine] instances`` given in the TOML (or by
``--set``) must agree with what the file gives, else the run is refused with one line naming the key, the file
and both values (so a sweep of ``policy.max_queue_delay_ms`` over a Triton config is refused up front: sweep
Triton configs instead). The resolved config (``config.json``) records the file (``policy.triton_config``, an
absolute path) and every parameter read from it; the summary names it too (``triton_config``).

**Priorities.** ``[workload] priority_mix = [0.2, 0.8]`` gives each query a priority level (1, 2, ...) drawn
with those probabilities (:func:`dvasim.workload.config.priority_draws`); without it every query is at the
default level. It needs the ``"triton"`` policy with at least that many ``priority_levels``.

May import: the foundation, the mechanism's limits, the policies (whose parameters it fills) and protobuf.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from dvasim.core.pipeline import MAX_INSTANCES
from dvasim.errors import ConfigError
from dvasim.policies.base import canonical_name
from dvasim.schema import find_file

DATA_DIR = Path(__file__).resolve().parent / "triton"
DESCRIPTOR_SET = DATA_DIR / "model_config.binpb"  # protoc --descriptor_set_out --include_imports model_config.proto
MESSAGE = "inference.ModelConfig"
FIELD = "policy.triton_config"
MAX_FILE_BYTES = 16 << 20  # a model configuration is a few kilobytes; refuse to read anything huge
POLICY_NAME = "triton"
CPU_DEFAULT_TWO = ("onnxruntime", "tensorflow")  # backends whose KIND_CPU groups default to 2 instances


@functools.lru_cache(maxsize=1)
def model_config_class():
    """Triton's ``inference.ModelConfig`` message class, built from the shipped descriptor set."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    files = descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTOR_SET.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for f in files.file:
        pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(MESSAGE))


def read_model_config(path: str | Path, field: str = FIELD):
    """The ``inference.ModelConfig`` message of a ``config.pbtxt``; one-line ConfigError naming ``field``, the
    file and (for a parse error) the line and column."""
    from google.protobuf import text_format

    p = Path(path)
    try:
        if p.stat().st_size > MAX_FILE_BYTES:
            raise ConfigError(field, f"{p}: {p.stat().st_size:,} bytes is no model configuration (at most "
                                     f"{MAX_FILE_BYTES:,}); give a config.pbtxt")
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(field, f"{p}: not UTF-8 text (byte {e.start}); give a config.pbtxt (protobuf text "
                                 "format)") from None
    except OSError as e:
        raise ConfigError(field, f"cannot read {p} ({e.strerror or e})") from None
    msg = model_config_class()()
    try:
        text_format.Parse(text, msg)
    except text_format.ParseError as e:
        detail = " ".join(str(e).split())
        line, col = e.GetLine(), e.GetColumn()
        if line is not None and detail.startswith(f"{line}:{col} :"):
            detail = detail[len(f"{line}:{col} :"):].strip()
        where = f"{p}:{line}:{col}" if line is not None else str(p)
        raise ConfigError(field, f"{where}: {detail} (Triton's model_config.proto, text format)") from None
    return msg


def _queue_policy(qp) -> dict[str, Any]:
    """A ``ModelQueuePolicy`` message as the policy's table (microseconds -> ms)."""
    return {"max_queue_size": int(qp.max_queue_size),
            "timeout_action": type(qp).TimeoutAction.Name(qp.timeout_action),
            "default_timeout_ms": qp.default_timeout_microseconds / 1000.0,
            "allow_timeout_override": bool(qp.allow_timeout_override)}


def _batching(msg, where: str) -> dict[str, Any]:
    """The policy's parameters from ``max_batch_size`` and ``dynamic_batching`` (Triton's checks)."""
    mbs = int(msg.max_batch_size)
    if mbs < 0:
        raise ConfigError(FIELD, f"{where}: max_batch_size must be >= 0 (Triton refuses {mbs})")
    scheduler = msg.WhichOneof("scheduling_choice")
    if scheduler in ("sequence_batching", "ensemble_scheduling") or msg.platform == "ensemble":
        raise ConfigError(FIELD, f"{where}: {scheduler or 'an ensemble'} is not simulated; dvasim simulates "
                                 "dynamic_batching or Triton's default scheduler (neither given)")
    params: dict[str, Any] = {"name": POLICY_NAME, "max_batch_size": max(1, mbs)}
    if scheduler is None:
        params["dynamic_batching"] = False
        return params
    db = msg.dynamic_batching
    for p in db.preferred_batch_size:
        if not 1 <= p <= mbs:
            raise ConfigError(FIELD, f"{where}: dynamic_batching.preferred_batch_size {p} must be in "
                                     f"1..max_batch_size ({mbs}) (Triton refuses it)")
    levels = int(db.priority_levels)
    if levels and not 1 <= db.default_priority_level <= levels:
        raise ConfigError(FIELD, f"{where}: dynamic_batching.default_priority_level must be in 1..{levels} "
                                 f"(priority_levels), got {db.default_priority_level} (Triton refuses it)")
    for level in db.priority_queue_policy:
        if not 1 <= level <= levels:
            raise ConfigError(FIELD, f"{where}: dynamic_batching.priority_queue_policy key {level} must be a "
                                     f"priority level in 1..{levels} (Triton refuses it)")
    params.update(preferred_batch_size=sorted(set(db.preferred_batch_size)),
                  max_queue_delay_ms=db.max_queue_delay_microseconds / 1000.0,
                  **_queue_policy(db.default_queue_policy), priority_levels=levels,
                  default_priority_level=int(db.default_priority_level))
    if db.priority_queue_policy:
        params["priority_queue_policy"] = {int(k): _queue_policy(v)
                                           for k, v in sorted(db.priority_queue_policy.items())}
    return params


def _backend(msg) -> str:
    """The config's backend (``backend``, else the one its ``platform`` implies, as Triton fills it in)."""
    if msg.backend:
        return msg.backend
    return msg.platform.split("_")[0] if msg.platform.startswith(("onnxruntime", "tensorflow")) else ""


def _instances(msg, where: str) -> int:
    """``[engine] instances`` from ``instance_group`` (see the module docstring)."""
    groups = list(msg.instance_group)
    if not groups:
        return 1
    kind_name = type(groups[0]).Kind.Name
    total, gpus, devices = 0, set(), set()
    for i, g in enumerate(groups):
        kind = kind_name(g.kind)
        devices.add("cpu" if kind == "KIND_CPU" else "gpu")
        if len(devices) > 1:
            raise ConfigError(FIELD, f"{where}: instance_group[{i}].kind {kind} mixes CPU and GPU instance groups; "
                                     "dvasim serves every instance on the one device the [model] table models")
        gpus.update(g.gpus)
        if len(gpus) > 1:
            raise ConfigError(FIELD, f"{where}: instance_group[{i}].gpus names GPUs {sorted(gpus)}; Triton makes "
                                     "count instances on each listed GPU, and dvasim simulates one device: list "
                                     "at most one GPU")
        if g.passive:  # not added to the scheduler: receives no requests
            continue
        default = 2 if kind == "KIND_CPU" and _backend(msg) in CPU_DEFAULT_TWO else 1
        total += int(g.count) if g.count >= 1 else default
    if total < 1:
        raise ConfigError(FIELD, f"{where}: every instance_group is passive; Triton would schedule no request")
    if total > MAX_INSTANCES:
        raise ConfigError(FIELD, f"{where}: instance_group counts sum to {total}; at most {MAX_INSTANCES} "
                                 "instances are simulated")
    return total


def triton_settings(path: str | Path, field: str = FIELD) -> tuple[dict[str, Any], int]:
    """``(policy, instances)`` of a Triton model configuration: the ``[policy]`` table it sets (``name =
    "triton"``, its parameters and ``triton_config``, the file's absolute path) and ``[engine] instances``."""
    p = Path(path).resolve()
    msg = read_model_config(p, field)
    where = str(p)
    params = _batching(msg, where)
    params["triton_config"] = where
    return params, _instances(msg, where)


def _same(policy_params: dict[str, Any], key: str, given: Any) -> bool:
    """``given`` for ``[policy] key`` means what the file's value means (each normalized by the policy)."""
    from dvasim.policies import make_policy

    base = {k: v for k, v in policy_params.items() if k != "name"}
    want = make_policy(POLICY_NAME, base).describe().get(key)
    got = make_policy(POLICY_NAME, {**base, key: given}).describe().get(key)
    return _plain(got) == _plain(want)


def _plain(v: Any) -> Any:
    """A value with its dict keys as strings (a TOML table's ``"1"`` is the file's level 1)."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return v


def apply_triton_config(raw: dict[str, Any], base_dir: str | None) -> dict[str, Any]:
    """A raw config (sections, before defaults) with ``[policy] triton_config`` replaced by what the file sets:
    ``[policy]`` becomes the ``"triton"`` policy with the file's parameters and ``[engine] instances`` the
    file's instance count. A key the TOML also gives must agree (else one line naming it, the file and both
    values). Then the checks that tie the policy to the workload (:func:`check_policy_workload`)."""
    policy = raw.get("policy") or {}
    path = policy.get("triton_config")
    if path is not None:
        file = find_file(path, base_dir, FIELD, " (a Triton model configuration, config.pbtxt)")
        params, instances = triton_settings(file)
        name = policy.get("name", POLICY_NAME)
        if not isinstance(name, str) or canonical_name(name) != POLICY_NAME:
            raise ConfigError("policy.name", f"{name!r} next to triton_config {file}, which sets Triton's dynamic "
                                             f"batcher ({POLICY_NAME!r}): remove name or set it to {POLICY_NAME!r}")
        for key, given in policy.items():
            if key in ("name", "triton_config"):
                continue
            if key not in params or not _same(params, key, given):
                shown = params.get(key, "(not set by it)")
                raise ConfigError(f"policy.{key}", f"{given!r} conflicts with {file}, which sets {shown!r}; "
                                                   "remove the key from [policy] or change the Triton config")
        engine = raw.get("engine") or {}
        if "instances" in engine and engine["instances"] != instances:
            raise ConfigError("engine.instances", f"{engine['instances']!r} conflicts with {file}, whose "
                                                  f"instance_group gives {instances}; remove it or change the "
                                                  "Triton config")
        raw = {**raw, "policy": params, "engine": {**engine, "instances": instances}}
    check_policy_workload(raw)
    return raw


def check_policy_workload(raw: dict[str, Any]) -> None:
    """``[workload] priority_mix`` needs the ``"triton"`` policy with enough ``priority_levels``; a closed loop
    cannot run a queue policy that refuses queries (a refused client would never send again)."""
    policy, workload = raw.get("policy") or {}, raw.get("workload") or {}
    if not isinstance(policy, dict) or not isinstance(workload, dict):
        return
    name = policy.get("name")
    triton = isinstance(name, str) and canonical_name(name) == POLICY_NAME
    mix = workload.get("priority_mix")
    if mix is not None:
        if not triton:
            raise ConfigError("workload.priority_mix", f"priorities need Triton's batcher with priority levels "
                                                       f"(policy {POLICY_NAME!r}), not {name or 'zerobatch'!r}")
        levels = policy.get("priority_levels", 0)
        if isinstance(mix, list) and isinstance(levels, int) and len(mix) > levels:
            raise ConfigError("workload.priority_mix", f"{len(mix)} levels, but the policy has priority_levels = "
                                                       f"{levels}; give at most {levels} fractions")
    if triton and workload.get("kind") == "closed":
        from dvasim.policies import make_policy

        params = {k: v for k, v in policy.items() if k != "name"}
        if make_policy(POLICY_NAME, params).refuses:
            raise ConfigError("workload.kind", "a closed loop cannot run a queue policy that refuses queries "
                                               "(max_queue_size, or timeouts that REJECT): a refused client "
                                               "would never send again; use an open-loop workload")
