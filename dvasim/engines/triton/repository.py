"""The model repository the ``triton`` engine serves: one model, ``dvasim``, whose ``config.pbtxt`` is dvasim's own
and whose ``model.py`` runs the config's latency table on the emulated device.

The ``config.pbtxt``:

* the config's own file (``[policy] triton_config``), copied with its ``name`` set to the served model's and its
  ``backend`` set to ``"python"`` (a ``platform`` removed), its inputs and outputs replaced by the engine's
  (``LEN``, the query's input length, and ``OUT``); every batching field (``max_batch_size``,
  ``dynamic_batching`` whole: preferred sizes, the delay, priority levels and queue policies) and
  ``instance_group`` kept as written, with ``KIND_GPU`` groups served as ``KIND_CPU`` (no GPU here);
* or written from the ``[policy]`` keys (ZeroBatch, DelayBatch, or ``"triton"``'s parameters) and ``[engine]
  instances`` (:func:`pbtxt_from_policy`).

``emulation.json`` beside ``model.py`` holds the table the model runs: per length bucket, ``T(b)`` and the demand
for every batch size ``1..max_batch_size``, looked up in the config's table exactly as the simulator looks it up
(:meth:`dvasim.model.table.LatencyTable.latency` and ``demand``), and the device's socket.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dvasim.errors import ConfigError

MODEL_NAME = "dvasim"
TEMPLATE = Path(__file__).with_name("model_template.py")
IO = ('input [ { name: "LEN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
      'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')


def _ms_to_us(ms: float) -> int:
    return int(round(float(ms) * 1000.0))


def _queue_policy_text(qp: dict[str, Any]) -> str:
    parts = []
    if qp.get("max_queue_size"):
        parts.append(f"max_queue_size: {int(qp['max_queue_size'])}")
    if qp.get("timeout_action", "REJECT") != "REJECT":
        parts.append(f"timeout_action: {qp['timeout_action']}")
    if qp.get("default_timeout_ms"):
        parts.append(f"default_timeout_microseconds: {_ms_to_us(qp['default_timeout_ms'])}")
    if qp.get("allow_timeout_override"):
        parts.append("allow_timeout_override: true")
    return " ".join(parts)


def pbtxt_from_policy(policy: dict[str, Any], instances: int) -> str:
    """A ``config.pbtxt`` for the resolved ``[policy]`` (with the policy's ``describe()``: every default filled) (``zerobatch``, ``delaybatch`` or ``triton``) and the
    instance count; ConfigError naming ``policy.name`` for a policy Triton does not run."""
    name = policy["name"]
    if name not in ("zerobatch", "delaybatch", "triton"):
        raise ConfigError("policy.name", f"{name!r} is not Triton's batcher: the triton engine serves zerobatch, "
                                         "delaybatch or triton (a config.pbtxt); simulate the others with dvasim run")
    mbs = int(policy.get("max_batch_size", 64))
    lines = [f'name: "{MODEL_NAME}"', 'backend: "python"', f"max_batch_size: {mbs}", IO.rstrip("\n")]
    if name != "triton" or policy.get("dynamic_batching", True):
        db = []
        pref = list(policy.get("preferred_batch_size") or [])
        if pref:
            db.append(f"preferred_batch_size: [ {', '.join(str(int(p)) for p in pref)} ]")
        delay = policy.get("max_queue_delay_ms") or 0.0  # resolved by the policy (its describe(): its default)
        if delay:
            db.append(f"max_queue_delay_microseconds: {_ms_to_us(delay)}")
        if policy.get("priority_levels"):
            db.append(f"priority_levels: {int(policy['priority_levels'])}")
            db.append(f"default_priority_level: {int(policy.get('default_priority_level') or 1)}")
        qp = _queue_policy_text(policy)
        if qp:
            db.append(f"default_queue_policy {{ {qp} }}")
        for level, p in sorted((policy.get("priority_queue_policy") or {}).items(), key=lambda kv: int(kv[0])):
            db.append(f"priority_queue_policy {{ key: {int(level)} value {{ {_queue_policy_text(p)} }} }}")
        lines.append("dynamic_batching {\n  " + "\n  ".join(db) + "\n}" if db else "dynamic_batching { }")
    lines.append(f"instance_group [ {{ count: {int(instances)} kind: KIND_CPU }} ]")
    return "\n".join(lines) + "\n"


def pbtxt_from_file(path: str | Path) -> str:
    """The user's ``config.pbtxt`` made servable here (see the module docstring), its batching untouched."""
    from google.protobuf import text_format

    from dvasim.config.triton import read_model_config

    msg = read_model_config(path)
    msg.name = MODEL_NAME
    msg.ClearField("platform")
    msg.backend = "python"
    del msg.input[:]
    del msg.output[:]
    for g in msg.instance_group:
        g.kind = type(g).Kind.Value("KIND_CPU")
        del g.gpus[:]
    msg.ClearField("optimization")
    return text_format.MessageToString(msg) + IO


def emulation(table, max_batch_size: int, lengths: list[int] | None) -> dict[str, Any]:
    """Per length bucket (the table's lengths the workload reaches; ``1`` for a table without lengths) the
    standalone time and the demand of every batch size ``1..max_batch_size`` (capped at the table's largest)."""
    if table.n_stages != 1:
        raise ConfigError("model.stages", f"the table has {table.n_stages} stages, and the triton engine serves a "
                                          "model whole (one Triton model, one stage): set stages = 1")
    top = min(int(max_batch_size), int(table.max_batch_size))
    if table.seq_lens is None:
        buckets = [1]
    else:
        want = sorted({table.bucket(int(L)) for L in (lengths or [int(table.seq_lens[0])])})
        buckets = [int(b) for b in want]
    lat, dem = {}, {}
    for L in buckets:
        seq = None if table.seq_lens is None else L
        lat[str(L)] = [float(table.latency(0, b, seq)) for b in range(1, top + 1)]
        dem[str(L)] = [float(table.demand(0, b, seq)) for b in range(1, top + 1)]
    return {"lengths": buckets, "latency_ms": lat, "demand": dem, "max_batch_size": top}


def write_repository(root: Path, pbtxt: str, emu: dict[str, Any], site: Path, device_socket: Path,
                     log_dir: Path) -> Path:
    """``root/dvasim/{config.pbtxt, 1/model.py, 1/emulation.json}``; returns ``root``."""
    version = root / MODEL_NAME / "1"
    version.mkdir(parents=True, exist_ok=True)
    (root / MODEL_NAME / "config.pbtxt").write_text(pbtxt, encoding="utf-8")
    (version / "model.py").write_text(TEMPLATE.read_text(encoding="utf-8").replace("@SITE@", str(site)),
                                      encoding="utf-8")
    (version / "emulation.json").write_text(json.dumps({**emu, "device_socket": str(device_socket),
                                                        "log_dir": str(log_dir)}), encoding="utf-8")
    return root
