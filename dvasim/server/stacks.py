"""The named serving stacks, every number with its provenance.

Each :class:`ServingStack` gives the host costs that a real server pays around the GPU (see
:mod:`dvasim.server`): per batch (request handling, the inputs' gathering, the copies, the synchronisation), per
stage launch (by module kind, per operator of the stage, so any slicing works), the host's resources (launching
cores, one interpreter lock) and its batch thread's habits (does it leave the GPU idle between batches?), and a
co-run penalty for concurrent workers.

Provenance keys in :attr:`ServingStack.sources`: ``measured`` (a file of this repository, measured on named
hardware), ``published`` (a paper and its table or figure, or a vendor's document), ``estimate`` (our reading,
said so). ``dvasim stacks [NAME]`` prints them.

Operators: a stage's launch cost is ``launch_fixed_ms + launch_per_op_ms * ops + launch_per_row_ms * share * b``,
where ``ops`` is the number of the zoo's operators (:mod:`dvasim.model.zoo`: a ResNet bottleneck block, a
BERT layer's attention or feed-forward half, a VGG convolution with its activation, ...) in the stage and
``share`` the stage's share of the model's operators. Measured on the H100 host (``traces/h100_replays/
*_launch.csv`` over ``traces/gpu/h100/measured/stage_bounds.csv``), a zoo operator costs 0.0445 ms of TorchScript
launching on ResNet152 and on BERT-base alike (0.0855 and 0.0806 ms eager), so the law holds across models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

INF = math.inf

# the fields a config's [server] section may override, with their help
FIELD_HELP: dict[str, str] = {
    "request_ms": "per batch: request handling and the scheduler's wake-up (ms)",
    "request_per_row_ms": "per query of a batch: its request's handling (ms)",
    "gather_per_row_ms": "per query of a batch: gathering its input into the batch (ms)",
    "gather_gbps": "host memory bandwidth of the inputs' concatenation (GB/s; inf = free)",
    "h2d_gbps": "host-to-device copy bandwidth (GB/s: pinned or pageable, see pinned; inf = free)",
    "pinned": "the inputs are copied from pinned (page-locked) memory (true) or pageable memory (false)",
    "d2h_gbps": "device-to-host copy bandwidth of the outputs (GB/s; inf = free)",
    "sync_ms": "per batch: the host's synchronisation with the GPU before it answers (ms)",
    "idle_between_batches": "the batch thread synchronises, copies back and answers before it takes its next batch "
                            "(true: the GPU waits for it) or hands that to a completion thread (false)",
    "modules": "module kind whose launches apply: tensorrt, tensorflow, eager, torchscript, cudagraph",
    "launch_fixed_ms": "host cost of every stage launch (ms)",
    "launch_per_op_ms": "host cost per operator of the launched stage (ms)",
    "launch_per_row_ms": "growth of a whole model's launching per batch row, shared by the stages by operators (ms)",
    "python_ms": "Python-level work of every launch, under the interpreter lock (ms)",
    "host_cores": "host cores that launch stages",
    "interpreter_lock": "Python-level work (and eager launches) serialised by one interpreter lock",
    "corun_per_worker": "co-run penalty: executions run 1 + k * (n - 1) times slower while n run at once",
    "triton_release": 'the Triton release whose instance pipeline Triton\'s batchers run: "21.10" (payloads formed '
                      'ahead and frozen, merged at dequeue), "current" (payloads grow until an instance takes '
                      'them), or "ideal" (no prefetch; an instance is free when its batch leaves)',
    "eager_batching": "TensorRT's optimization.eager_batching: more batches issued per instance before their "
                      "inputs are consumed (2 in 21.10, 3 current)",
}
BOOL_FIELDS = ("pinned", "idle_between_batches", "interpreter_lock", "eager_batching")
RELEASE_FIELDS = ("triton_release", "eager_batching")  # the batcher's, not host costs: any stack takes them
MODULE_KINDS = ("tensorrt", "tensorflow", "eager", "torchscript", "cudagraph")


@dataclass(frozen=True)
class ServingStack:
    name: str
    summary: str
    adds_nothing: bool = False  # gpu-only / as-profiled: no host model at all
    request_ms: float = 0.0
    request_per_row_ms: float = 0.0
    gather_per_row_ms: float = 0.0
    gather_gbps: float = INF
    h2d_gbps: float = INF
    pinned: bool = True
    d2h_gbps: float = INF
    sync_ms: float = 0.0
    idle_between_batches: bool = False
    modules: str = "cudagraph"
    launch_fixed_ms: float = 0.0
    launch_per_op_ms: float = 0.0
    launch_per_row_ms: float = 0.0
    python_ms: float = 0.0
    host_cores: float = 16.0
    interpreter_lock: bool = False
    corun_per_worker: float = 0.0
    triton_release: str = "ideal"
    eager_batching: bool = False
    # the client's path to the batcher's queue and back (ms quantiles at evenly spaced levels 0..1): taken as the
    # run's [engine] admission_delay_ms where the config gives none (a fitted stack of a real server: the gRPC
    # client, the front end and the answer's way back, which a request pays outside the batcher)
    client_path_ms: tuple[float, ...] = ()
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def with_overrides(self, values: dict[str, Any]) -> ServingStack:
        """A copy with ``values`` (checked by :func:`dvasim.server.resolve.stack_overrides`) in place; the
        overridden fields' provenance says so."""
        if not values:
            return self
        src = dict(self.sources)
        for k in values:
            src[k] = "set in the config's [server] section"
        return replace(self, sources=src, **values)

    def parameters(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name in FIELD_HELP}

    def describe(self) -> dict[str, Any]:
        out = {"name": self.name, "summary": self.summary, "triton_release": self.triton_release}
        if self.eager_batching:
            out["eager_batching"] = True
        if self.client_path_ms:
            q = self.client_path_ms
            out["client_path_ms"] = {"min": q[0], "median": q[len(q) // 2], "max": q[-1], "quantiles": len(q)}
        if not self.adds_nothing:
            out.update({k: (str(v) if isinstance(v, float) and math.isinf(v) else v)
                        for k, v in self.parameters().items()})
        return out


# ------------------------------------------------------------------------------------------------ provenance
H100_LAUNCH = ("measured: traces/h100_replays/{resnet152,bert_base}_launch.csv (NVIDIA H100 80GB HBM3 host, 16 "
               "cores, torch 2.11.0+cu130) over the stages' operator counts (traces/gpu/h100/measured/"
               "stage_bounds.csv): median launch_ms / operators")
H100_REPLAY = ("measured: traces/h100_replays/*/executions.csv.gz (the H100 replays' stage executions, "
               "TorchScript stages)")
PCIE3 = ("published: PCIe 3.0 x16 moves 15.75 GB/s raw; pinned host-to-device copies reach about 11-12 GB/s on "
         "such hosts (a user report of 11 GB/s on a Titan X, PCIe 3.0 x16, under NVIDIA's 'How to Optimize Data "
         "Transfers in CUDA C/C++'; dvasim's [engine.transfer] default 12), pageable copies about half (an estimate "
         "from the pinned/pageable ratio measured on PCIe 2: 5.9 vs 4.5 GB/s)")

STACKS: dict[str, ServingStack] = {}


def _add(stack: ServingStack) -> None:
    # the batcher's release: a stack that serves no Triton of its own runs Triton's batchers idealised
    own = {"triton_release": "by definition: no Triton instance pipeline in this stack (Triton's batchers "
                             "idealised: no prefetch, an instance free when its batch leaves)",
           "eager_batching": "by definition: off (a TensorRT option)"}
    STACKS[stack.name] = replace(stack, sources={**own, **stack.sources})


_add(ServingStack(
    "gpu-only", "a lower bound: the GPU's time alone, no host cost of any kind (no real server runs this way), "
    "Triton's batchers idealised (no prefetch) unless [server] triton_release says",
    adds_nothing=True, sources={"all": "by definition: nothing beside the latency table's GPU time"}))

_add(ServingStack(
    "as-profiled", "the table's stage times taken as the whole serving cost: a table measured end to end on the "
    "user's own server (or whose source names no stack); nothing is added to it",
    adds_nothing=True, sources={"all": "the table's own measurement; nothing added"}))

# ---------------------------------------------------------------------------- the replay's module kinds (torch)
# Measured on the H100 host by the project's replays (TorchScript stages, 2026-11-22; traces/h100_replays/): the
# first stage's input path (gather on the host, pageable copy) costs 0.371 ms + 0.128 ms per 602,112-byte image
# (least squares on the per-batch-size medians of ResNet152's first-stage copy_ms, R2 0.99), of which 0.11 ms is the
# buffer copy every stage pays: 0.26 ms per batch and 4.7 GB/s effective; every launch's hand-off to its executor
# thread 0.14 ms (median handoff_ms) and buffer copies 0.11 ms (median copy_ms of stages 1-3, ResNet152), under the
# interpreter lock; the wait for a stage's event 38 us (median eager_ms - eager_launch_ms, stage_times.csv). The
# three stacks differ in how a stage's kernels are launched. Host timings moved up to 2x between runs on that host.
H100_STAGES = ("measured: traces/gpu/h100/measured/stage_times.csv (H100 host, torch 2.11.0+cu130, 2026-11-22)")
_TORCH_COMMON = dict(
    request_ms=0.26, request_per_row_ms=0.0, gather_per_row_ms=0.0, gather_gbps=INF,
    h2d_gbps=602112 / 0.128 / 1e6, pinned=False, d2h_gbps=INF, sync_ms=0.038, idle_between_batches=True,
    launch_per_row_ms=0.0, python_ms=0.14 + 0.11, host_cores=16.0, interpreter_lock=True, corun_per_worker=0.0)
_TORCH_SOURCES = {
    "request_ms": H100_REPLAY + ": intercept of ResNet152's first-stage copy_ms against the batch size (0.371 ms) "
                  "less the 0.11 ms buffer copy every stage pays",
    "request_per_row_ms": "measured: the requests reach the replay's front door already parsed (its admission "
                          "delay, 0.04 ms mean, is [engine] admission_delay_ms, not a per-batch cost)",
    "gather_per_row_ms": "measured: in h2d_gbps (the gather and the copy are timed together)",
    "gather_gbps": "measured: in h2d_gbps (the gather and the copy are timed together)",
    "h2d_gbps": H100_REPLAY + ": 602,112 bytes / 0.128 ms per image, the slope of ResNet152's first-stage copy_ms "
                "(the host gather and the pageable copy together: 4.7 GB/s)",
    "pinned": "measured: the replay copies the gathered (pageable) batch with Tensor.to (dvasim/engines/replay/engine.py)",
    "d2h_gbps": "measured: the outputs' copy back is in each launch's buffer copies (python_ms); a few KB",
    "sync_ms": H100_STAGES + ": median eager_ms - eager_launch_ms of the host-bound points, 38 us",
    "idle_between_batches": "measured: the replay's executor thread waits for its stage's event and hands the "
                            "outputs on before it takes its next batch (dvasim/engines/replay/engine.py)",
    "launch_per_row_ms": H100_STAGES + ": the launch cost shows no consistent slope in the batch size "
                         "(-0.04..+0.03 ms per row across stages)",
    "python_ms": H100_REPLAY + ": median handoff_ms 0.14 + median copy_ms of stages 1-3, 0.11 (ResNet152; BERT's "
                 "copies are 0.15-0.25)",
    "host_cores": "measured: the H100 host's 16 cores (an in-sample fit of launching cores gave 2.5-2.9 when 3-4 "
                  "stages overlap, but no single value served both models: experiments/h100_fit/README.md)",
    "interpreter_lock": "measured: four eager launching threads ran 0.9-1.2x as fast as one (the GIL; "
                        "shared gpu-h100 README, host diagnostics); the replay's control plane is Python",
    "corun_per_worker": "measured: no co-run slowdown of the GPU side beyond the fluid device model was isolated",
}


def _torch_stack(name: str, summary: str, modules: str, launch_fixed_ms: float, launch_per_op_ms: float,
                 launch_sources: dict[str, str]) -> ServingStack:
    """One of the replay's module kinds: the H100 host's measured costs, its own launching."""
    return ServingStack(name, summary, modules=modules, launch_fixed_ms=launch_fixed_ms,
                        launch_per_op_ms=launch_per_op_ms, **_TORCH_COMMON,
                        sources={**_TORCH_SOURCES, "modules": "by definition", **launch_sources})


_add(_torch_stack(
    "torchscript", "stages as TorchScript modules (traced, frozen) driven by Python executor threads, as the "
    "replay runs them on a GPU; a stage's kernels are launched in C++ without the interpreter lock",
    "torchscript", 0.0, 0.0445,
    {"launch_per_op_ms": H100_LAUNCH + " (TorchScript: 0.0445 ResNet152, 0.0444 BERT-base; in serving the fitted "
                         "BERT launches were about 2x the profile: shapes re-specialised per length)",
     "launch_fixed_ms": "measured: not resolvable from the stages' launch costs (fits give 0.04 to 0.25 ms "
                        "depending on the weighting): 0 taken"}))
_add(_torch_stack(
    "pytorch-eager", "stages as eager PyTorch modules: every operator returns to the interpreter, so a stage's "
    "launching holds the interpreter lock throughout",
    "eager", 0.0, 0.083,
    {"launch_per_op_ms": H100_LAUNCH + " (eager: 0.086 ResNet152, 0.081 BERT-base, 0.083 UNet; VGG19's operators "
                         "hold fewer kernels: 0.046); per torch operator 26-28 us",
     "launch_fixed_ms": "measured: at most about 0.04 ms (VGG19's 2-operator stage launches in 0.042 ms); fits give "
                        "-0.02 to 0.13 ms: 0 taken"}))
_add(_torch_stack(
    "cudagraph", "stages captured as CUDA graphs (one per batch size and length bucket), replayed by Python "
    "executor threads: a launch is one static-input copy and one graph launch",
    "cudagraph", 0.05, 0.0,
    {"launch_fixed_ms": "measured: (a bound) a graph replay call took 0.25-0.29 ms against 0.19-0.28 ms of GPU time "
                        "(BERT-base batch 1), so its host part is at most about 0.05 ms (shared gpu-h100 README, "
                        "host diagnostics, against stage_times.csv graph_ms)",
     "launch_per_op_ms": "published: a graph is submitted whole (an 80-kernel graph launched with 3.5 us of CPU "
                         "time, CUDA.jl documentation; NVIDIA, 'Constant Time Launch for Straight-Line Graphs', CUDA "
                         "12.6): its kernels cost the host nothing one by one"}))

# ------------------------------------------------------------------------------------- Triton with TensorRT
TRT_BACKEND = ("published: triton-inference-server/tensorrt_backend (2021-22 and current sources): separate input "
               "and output copy streams, 2-3 CUDA event sets 'for current request and next request', the next "
               "batch's inputs copied once TensorRT has consumed the current ones (enqueueV2's input-consumed "
               "event), outputs answered by a per-instance completion thread")
TRITON_CURRENT = ("published: Triton core main (73aad7c3) and tensorrt_backend main (e2ef6d79): payloads grow "
                  "until an instance takes them (#3789), the instance freed at inputs-consumed "
                  "(dvasim/policies/triton_release.py cites the lines)")
TRITON_2110 = ("published: the DVABatch paper's Triton 21.10 (Table 1), server and tensorrt_backend branches r21.10 "
               "(5e5db26c9d08, 61925b32): payloads formed ahead and frozen, merged at dequeue, the instance freed at "
               "inputs-consumed (dvasim/policies/triton_release.py cites the lines)")
_add(ServingStack(
    "triton-tensorrt", "Triton's dynamic batcher feeding TensorRT engines (the DVABatch paper's stack, §8.1 and "
    "Table 1; Titan RTX, PCIe 3.0): C++ throughout, inputs gathered into pinned memory and copied asynchronously, "
    "a completion thread answers",
    request_ms=0.02, request_per_row_ms=0.0, gather_per_row_ms=0.0039, gather_gbps=5.0, h2d_gbps=12.0, pinned=True,
    d2h_gbps=12.0, sync_ms=0.038, idle_between_batches=False, modules="tensorrt", launch_fixed_ms=0.29 / 4,
    launch_per_op_ms=0.005, launch_per_row_ms=0.0, python_ms=0.0, host_cores=10.0, interpreter_lock=False,
    corun_per_worker=0.0, triton_release="current",
    sources={
        "triton_release": TRITON_CURRENT,
        "eager_batching": "published: off unless a model's config sets optimization.eager_batching",
        "request_ms": "estimate: the dynamic batcher waking the instance thread (no published number; the Python "
                      "replay's 0.14 ms hand-off is an upper bound for C++)",
        "request_per_row_ms": "published: Triton parses requests on its HTTP/gRPC front-end threads, in parallel and "
                              "off the batch's path (the batch's model instance sees them parsed)",
        "gather_per_row_ms": "published: 3.9 us per request copy (E2bird §5.3: 256 image copies split one by one "
                             "cost under 1 ms more, on the same Titan RTX / PCIe 3.0 class of host)",
        "gather_gbps": "estimate: one host memcpy into the pinned staging buffer at about 5 GB/s on a 2014-2019 "
                       "Xeon core (the H100 host's measured gather and pageable copy together ran at 4.7 GB/s)",
        "h2d_gbps": PCIE3,
        "pinned": "published: Triton's input_pinned_memory / output_pinned_memory default to true "
                  "(model_config.proto, ModelOptimizationPolicy)",
        "d2h_gbps": PCIE3,
        "sync_ms": "estimate: the H100 host's measured 38 us wait for a stage's event (stage_times.csv), taken for "
                   "the completion thread's wait",
        "idle_between_batches": TRT_BACKEND,
        "modules": "by definition",
        "launch_fixed_ms": "estimate: from a published total, DVABatch §8.8 (Figure 21) measured its closed-loop "
                           "overhead over Triton's ZeroBatch at 0.29 ms on average, with 4 stages for ResNet152 and "
                           "LinkNet (§8.7): 0.29 / 4 per stage launch",
        "launch_per_op_ms": "published: a kernel launch costs the host 4-6 us (HTA docs: 'usually between 5-20 "
                            "microseconds'); a zoo operator is one fused kernel as TensorRT runs it "
                            "(dvasim/model/zoo): 5 us",
        "launch_per_row_ms": "estimate: a TensorRT enqueue launches the same kernels at any batch size",
        "python_ms": "by definition: no Python in the serving path",
        "host_cores": "published: the DVABatch artifact's host, Xeon Silver 4210R, 10 cores (Appendix A)",
        "interpreter_lock": "by definition: C++ throughout",
        "corun_per_worker": "published: none measured (§8.6-8.7 say only that more buffer pairs and stages cost "
                            "scheduling overhead, which launch_fixed_ms carries)",
    }))

# ------------------------------------------------------------------------------------------------ TF-Serving
# E2bird's Figure 3 shows the GPU idle between a batch thread's batches (scheduling, the CPU-side concatenation, the
# input copy, the result's copy back); the figure is not legible in our copy of the paper, so the gap is built
# bottom-up from the parts below: at ResNet152 batch 32 about 0.3 + 32 * (0.0039 + 0.12) + 3.2 + 0.06 = 7.5 ms, of a
# 93.7 ms batch (Table 1), uncertain by 2x.
_add(ServingStack(
    "tfserving", "TF-Serving's batching (E2bird §3.2, Figure 3): one batch thread concatenates the inputs on the "
    "host, copies them from pageable memory, runs the session, copies the results back and answers before its next "
    "batch, so the GPU idles between the thread's batches",
    request_ms=0.3, request_per_row_ms=0.0, gather_per_row_ms=0.0039, gather_gbps=5.0, h2d_gbps=6.0, pinned=False,
    d2h_gbps=6.0, sync_ms=0.038, idle_between_batches=True, modules="tensorflow", launch_fixed_ms=0.0,
    launch_per_op_ms=0.025, launch_per_row_ms=0.0, python_ms=0.0, host_cores=6.0, interpreter_lock=False,
    corun_per_worker=0.0,
    sources={
        "request_ms": "estimate: the batch scheduler's wake-up and the session's dispatch, 0.1-0.5 ms (E2bird §3.2 "
                      "names 'the scheduling overhead' in the idle gap without a number): 0.3",
        "request_per_row_ms": "published: TF-Serving parses a Predict request on its gRPC threads, off the batch "
                              "thread's path (E2bird §3.2; tensorflow basic_batch_scheduler)",
        "gather_per_row_ms": "published: 3.9 us per request copy (E2bird §5.3, Figure 7)",
        "gather_gbps": "estimate: TF-Serving concatenates the batch's tensors on the CPU ('Batch operations of input "
                       "data are performed on the CPU side', E2bird §1) at about 5 GB/s on a Xeon E5-2620 v3 core",
        "h2d_gbps": PCIE3 + "; TF copies the concatenated (pageable) batch: 6 GB/s",
        "pinned": "estimate: E2bird does not say; the concatenated batch is an ordinary host tensor",
        "d2h_gbps": PCIE3 + "; pageable: 6 GB/s",
        "sync_ms": "estimate: the H100 host's measured 38 us wait for the GPU (stage_times.csv)",
        "idle_between_batches": "published: E2bird §1 ('only after a batch of inferences returns, the next batch can "
                                "be launched'), §3.2 and Figure 3 ('the GPU is idle between adjacent batches')",
        "modules": "by definition",
        "launch_fixed_ms": "estimate: the session's dispatch is in request_ms",
        "launch_per_op_ms": "estimate: 5-20 us a kernel launch (HTA docs), about 3 unfused kernels per zoo operator "
                            "(convolution, batch norm, activation: 3.3 torch operators per ResNet zoo operator, "
                            "counted on the zoo), asynchronous: 0.025",
        "launch_per_row_ms": "estimate: the same kernels at any batch size",
        "python_ms": "by definition: C++ throughout",
        "host_cores": "published: E2bird Table 5, Xeon E5-2620 v3 (6 cores)",
        "interpreter_lock": "by definition: C++ throughout",
        "corun_per_worker": "published: E2bird §6.3 (Figure 7) finds the computation latency stable from 1 to 64 "
                            "concurrent workers and §7.3.1 three workers (8, 8, 16) 9% faster than one of 32; both "
                            "E2bird engines have at most 6 workers: no penalty. (Its 'many workers of batch size 1 "
                            "... 4x' mixes interference with the lost batching, which the device model has)",
    }))

# The paper's release: the same host, Triton's r21.10 instance pipeline
_TRT = STACKS["triton-tensorrt"]
_add(replace(_TRT, name="triton-tensorrt-21.10",
             summary="Triton 21.10 with TensorRT, the DVABatch paper's release (§8.1, Table 1): as triton-tensorrt, "
                     "but its batcher forms payloads ahead of a busy instance and never grows a queued one",
             triton_release="21.10", sources={**_TRT.sources, "triton_release": TRITON_2110}))


# ------------------------------------------------------------------------------------------------- stack files
STACK_FILE_KEYS = ("name", "summary", *FIELD_HELP, "client_path_ms")  # every one pinned in a stack file


def stack_from_toml(text: str, where: str, field_name: str = "server.stack") -> ServingStack:
    """A :class:`ServingStack` from a stack file (``dvasim fit`` on real-server runs writes them): a ``[stack]``
    table pinning every field of :data:`STACK_FILE_KEYS` (so a later dvasim with new defaults reproduces it or
    refuses it), and ``[sources]``, each field's provenance. A missing, unknown or mistyped field is one
    :class:`~dvasim.errors.ConfigError` naming it."""
    import tomllib

    from dvasim.errors import ConfigError

    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(field_name, f"{where}: not TOML ({e})") from None
    table = doc.get("stack")
    if not isinstance(table, dict):
        raise ConfigError(field_name, f"{where}: no [stack] table; a stack file pins every field under [stack]")
    unknown = sorted(set(table) - set(STACK_FILE_KEYS))
    if unknown:
        raise ConfigError(field_name, f"{where}: unknown field [stack] {unknown[0]}; known: "
                                      f"{', '.join(STACK_FILE_KEYS)}")
    missing = [k for k in STACK_FILE_KEYS if k not in table]
    if missing:
        raise ConfigError(field_name, f"{where}: [stack] {missing[0]} is missing; a stack file pins every field "
                                      "(so that another release of dvasim reproduces it): add it")
    values = {}
    defaults = ServingStack("x", "x")
    for k in STACK_FILE_KEYS:
        v = table[k]
        want = getattr(defaults, k)
        if k == "client_path_ms":
            ok = isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v) \
                and (not v or (len(v) >= 2 and all(a <= b for a, b in zip(v, v[1:])) and v[0] >= 0))
            if not ok:
                raise ConfigError(field_name, f"{where}: [stack] client_path_ms must be [] or >= 2 non-decreasing "
                                              "quantiles >= 0 (ms)")
            v = tuple(float(x) for x in v)
        elif isinstance(want, bool):
            if not isinstance(v, bool):
                raise ConfigError(field_name, f"{where}: [stack] {k} must be true or false, got {v!r}")
        elif isinstance(want, float):
            if isinstance(v, str) and v == "inf":
                v = INF
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ConfigError(field_name, f"{where}: [stack] {k} must be a number >= 0 (or \"inf\"), got {v!r}")
            v = float(v)
        elif not isinstance(v, str):
            raise ConfigError(field_name, f"{where}: [stack] {k} must be a string, got {v!r}")
        values[k] = v
    if values["modules"] not in MODULE_KINDS:
        raise ConfigError(field_name, f"{where}: [stack] modules {values['modules']!r}; one of "
                                      f"{', '.join(MODULE_KINDS)}")
    from dvasim.policies.triton_release import RELEASES

    if values["triton_release"] not in RELEASES:
        raise ConfigError(field_name, f"{where}: [stack] triton_release {values['triton_release']!r}; one of "
                                      f"{', '.join(RELEASES)}")
    sources = doc.get("sources") or {}
    return ServingStack(**values, sources={str(k): str(v) for k, v in sources.items()})


def stack_to_toml(stack: ServingStack, header: str = "") -> str:
    """The stack file of ``stack`` (:func:`stack_from_toml` reads it back to an equal stack)."""
    def val(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float):
            return '"inf"' if math.isinf(v) else repr(v)
        if isinstance(v, tuple):
            return "[" + ", ".join(repr(float(x)) for x in v) + "]"
        return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    lines += ["[stack]"] + [f"{k} = {val(getattr(stack, k))}" for k in STACK_FILE_KEYS]
    lines += ["", "[sources]"] + [f"{k} = {val(v)}" for k, v in sorted(stack.sources.items())]
    return "\n".join(lines) + "\n"


STACK_DIR = Path(__file__).resolve().parent / "stack_files"


def _add_file(name: str) -> None:
    path = STACK_DIR / f"{name}.toml"
    if path.exists():  # (a checkout that lacks it lacks the stack: tests/server checks it ships)
        STACKS[name] = stack_from_toml(path.read_text(encoding="utf-8"), str(path))


# Triton's Python backend on this machine's CPU, behind gRPC: fitted by dvasim fit on the real server's calibration
# runs (experiments/validation/triton/; the file names them)
_add_file("triton-python-cpu")
