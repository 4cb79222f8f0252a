"""The config schema: every section a config may hold, assembled from the one declaration of each.

``[qos]``, ``[engine]``, ``[replay]`` and ``[policy]``'s ``name`` are declared here; ``[model]`` in
:mod:`dvasim.model.catalog`, ``[workload]`` in :mod:`dvasim.workload.config`, ``[server]`` in
:mod:`dvasim.server.resolve`, ``[cluster]`` in :mod:`dvasim.server.router`, ``[engine.host]`` in :mod:`dvasim.server.host` and ``[engine.transfer]`` in
:mod:`dvasim.server.transfer`, next to the code each configures. A policy's parameters are declared by the policy
(``params`` and its constructor's defaults, :func:`dvasim.policies.base.policy_reference`). Validation
(:func:`dvasim.config.check.resolve`), ``--set`` (:mod:`dvasim.config.overrides`), ``dvasim config``'s help and
``docs/config.md`` (:mod:`dvasim.config.reference`) all read :data:`SCHEMA`.
"""

from __future__ import annotations

from dvasim.core.pipeline import MAX_INSTANCES
from dvasim.model.catalog import MODEL
from dvasim.schema import MAX_FACTOR, MAX_MS, Key, Section
from dvasim.server.host import HOST
from dvasim.server.resolve import SERVER
from dvasim.server.router import CLUSTER
from dvasim.server.transfer import TRANSFER
from dvasim.workload.config import WORKLOAD

# sizes a run can hold: every buffer pair and instance is state the engine keeps (and a real GPU memory)
MAX_BUFFER_PAIRS = 64
MAX_CORES = 4096
MAX_SERVICE_CV = 10.0
SHARING_MODES = ("fluid", "exclusive", "parallel", "cores")  # the simulator's device-sharing models
# how overlapped executions contend beyond the sharing model (dvasim.engines.sim.device): "none" (the sharing model
# alone) or "overlap" (every running execution claims at least a share of the device, [engine] contention_share)
CONTENTION_MODELS = ("none", "overlap")
# contention_share when absent: calibrated on the H100's four-thread co-run (traces/gpu/h100/measured/
# overlap_4threads.csv, CUDA-graph rows at batch 1; dvasim.studies.contention.calibrate_share reproduces it,
# tests/engines/test_contention.py checks that it does)
OVERLAP_SHARE_H100 = 0.379
REPLAY_MODULES = ("auto", "cudagraph", "torchscript", "eager")

POLICY = Section("policy", "the batching policy: its name; its other keys are the policy's parameters "
                           "(dvasim policies NAME)", (
    Key("name", "str", "any registered policy or alias (dvasim policies)", default="zerobatch"),
    Key("triton_config", "path", "a Triton model configuration (config.pbtxt): the policy becomes Triton's dynamic "
        'batcher ("triton") with its batching, queue policy and priority levels, and [engine] instances its '
        "instance_group counts; other [policy] keys and engine.instances must agree with it (dvasim.config.triton)"),
), open=True, open_help="the named policy's parameters")

QOS = Section("qos", "the service's latency target", (
    Key("target_ms", "number", "latency target for the QoS violation rate (ms)", default=200.0, minimum=0,
        strict=True),
    Key("warmup_fraction", "number", "share of the first queries (by arrival) left out of the stability verdict, "
        "in [0, 1)", default=0.0, minimum=0, maximum=1, strict_max=True),
    Key("percentile", "number", "the percentile whose latency must be within target_ms for the verdict \"stable\" "
        "(MLPerf LoadGen's Server percentile, 99)", default=99.0, minimum=0, maximum=100, strict=True,
        strict_max=True),
    Key("trigger", "choice", 'the trigger test: "backlog" runs the config again with a backlog (workload.backlog) '
        'and calls a run that does not recover "metastable"; "none": no test', default="none",
        choices=("none", "backlog")),
    Key("trigger_slos", "number", "the trigger's backlog in SLOs of arrivals: ceil(trigger_slos x rate x target_ms)",
        default=1.0, minimum=0, strict=True, maximum=1000),
    Key("trigger_queries", "int", "queries of the trigger's run after its backlog (default: the run's own; a recovery "
        "shows within a few hundred SLOs)", minimum=2, maximum=20_000_000),
))

ENGINE = Section("engine", "the serving pipeline's engine: buffers, instances, device sharing, host costs", (
    Key("buffer_pairs", "int", "number of buffer pairs (1 = serial manner)", default=2, minimum=1,
        maximum=MAX_BUFFER_PAIRS),
    Key("instances", "int", "model instances: parallel chains of stage executors sharing the device", default=1,
        minimum=1, maximum=MAX_INSTANCES),
    Key("sharing", "choice", "device-sharing model", default="fluid", choices=SHARING_MODES),
    Key("corun_slowdown", "number", "rate divisor while two or more executions overlap", default=1.0, minimum=1,
        maximum=MAX_FACTOR),
    Key("contention", "choice", 'how overlapped executions contend beyond the sharing model (absent: "none"): '
        '"overlap" makes every running execution claim at least contention_share of the device (its demand d '
        'counts as share + (1 - share) * d; one execution alone runs as before); sharing = "fluid" only',
        choices=CONTENTION_MODELS),
    Key("contention_share", "number", 'the share of the device every running execution claims under contention = '
        f'"overlap" (absent: {OVERLAP_SHARE_H100}, calibrated on an H100\'s four CUDA-graph threads at batch 1)',
        minimum=0, maximum=1),
    Key("cores", "int", 'CPU cores for sharing = "cores" (each execution takes one)', default=2, minimum=1,
        maximum=MAX_CORES),
    Key("launch_overhead_ms", "number", "host-side scheduling cost added to every stage launch (ms)", default=0.0,
        minimum=0),
    Key("admission_delay_ms", "any", "time from a query's arrival until the front door sees it (the receiving "
        f"thread's wake-up): a number in [0, {MAX_MS:g}], or a list of >= 2 non-decreasing quantiles of its distribution (ms)",
        default=0.0),
    Key("service_cv", "number", "run-to-run jitter of execution times: coefficient of variation of a mean-1 "
        "log-normal factor (at most 10: a log-normal sigma of 2.15, far beyond any measured device)", default=0.0,
        minimum=0, maximum=MAX_SERVICE_CV),
    Key("progress", "bool", "show a progress bar", default=False),
    Key("host", "table", "the host of a GPU run (launch costs, launching cores, interpreter lock)", section=HOST),
    Key("transfer", "table", "host-to-GPU input copies", section=TRANSFER),
))

REPLAY = Section("replay", "how `dvasim replay` runs the stage modules", (
    Key("modules", "choice", '"auto" (CUDA graphs on a GPU, TorchScript on a CPU), "cudagraph", "torchscript" '
        '(traced and frozen) or "eager"', default="auto", choices=REPLAY_MODULES),
))

SCHEMA: dict[str, Section] = {s.name: s for s in (MODEL, POLICY, WORKLOAD, QOS, ENGINE, REPLAY, SERVER,
                                                          CLUSTER)}
SECTIONS = tuple(SCHEMA)
SUBSECTIONS: dict[str, Section] = {f"engine.{k.name}": k.section for k in ENGINE.keys if k.kind == "table"}
DEFAULTS = {name: ({} if name in ("model", "workload", "server") else s.defaults()) for name, s in SCHEMA.items()}
