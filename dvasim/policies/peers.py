"""Peer systems' batching policies on the same engine: TF-Serving (E2bird's NO_Wait, OPT_Wait and Static) and
LazyBatching's baselines (Serial and graph batching, GraphB).

All of them batch at the front door only and run a batch *whole*: an instance (``[engine] instances``; TF-Serving's
batch threads, a server's model copies) holds one batch at a time, from its first stage to its exit, and the next
batch is formed only when an instance is free -- single entry, single exit, no stretch, no split. That is exactly
the gating of Triton's dynamic batcher (:class:`dvasim.policies.triton.TritonDynamicBatcher`), so these policies
reuse it (without Triton's preferred batch sizes, which neither peer has):

1. if ``max_batch_size`` requests are waiting, a batch of ``max_batch_size`` leaves at once;
2. else, if the oldest waiting request has waited ``max_queue_delay_ms`` (the timeout / window), every waiting
   request leaves as one batch;
3. else the front door waits (for the timeout, or for more requests).

A timeout or window is counted from the oldest waiting request's arrival (for TF-Serving: from the moment its
open batch received its first task). When the timeout expires while every instance is busy, the waiting requests
keep queueing (up to ``max_batch_size``) and leave together when an instance frees.
"""

from __future__ import annotations

from dvasim.errors import ConfigError
from dvasim.policies.base import check_nonneg_number, check_positive_int, register
from dvasim.policies.triton import TritonDynamicBatcher


class _PeerBatcher(TritonDynamicBatcher):
    """Triton's dynamic batcher without preferred batch sizes: the common core of every peer policy here (each
    declares its own ``params``)."""

    default_max_batch_size = 32

    def __init__(self, max_batch_size=None, max_queue_delay_ms=None):
        if max_batch_size is None:
            max_batch_size = self.default_max_batch_size
        super().__init__(max_batch_size=max_batch_size, preferred_batch_size=None,
                         max_queue_delay_ms=max_queue_delay_ms)


# ----------------------------------------------------------------------------- TF-Serving (E2bird, TPDS'21 §3.2)
class _TFServing(_PeerBatcher):
    """TF-Serving's batching scheduler (``BasicBatchScheduler`` / ``SharedBatchScheduler``).

    What TF-Serving does: requests are appended to an *open* batch; the open batch is closed when it holds
    ``max_batch_size`` tasks (a new open batch is started for the next request) and becomes schedulable when it
    is full or when ``batch_timeout_micros`` has passed since its first task; a free batch thread takes the oldest
    schedulable batch and runs the whole model on it. E2bird (§3.2) notes that TF-Serving schedules batches
    *sequentially*: the next batch starts only after the current one's results are back.

    How it is modelled: a batch thread is an instance of the pipeline (``[engine] instances``, default 1), one
    batch at a time per instance, run whole. This is Triton's dynamic batcher without preferred batch sizes:
    closed full batches waiting for a thread are the ``max_batch_size`` requests at the head of the queue, and
    the open batch, which keeps taking requests while every thread is busy, is what is left behind them.

    Where it differs from Triton (and what is assumed): TF-Serving has no preferred batch sizes (its
    ``allowed_batch_sizes`` pad a batch *up* to the next allowed size instead: see ``tfserving-static``); its
    ``max_enqueued_batches`` bound (a rejection) is not modelled: the queue is unbounded. E2bird's observed idle
    gap between batches (transfers and scheduling, no transfer/compute overlap) is not added here: it belongs to
    the engine (``[engine] launch_overhead_ms`` or a host model), not to the batching policy.
    """


@register
class TFServingNoWait(_TFServing):
    """E2bird's ``NO_Wait`` (TF-Serving, ``batch_timeout_micros = 0``, max batch 32): whatever has queued while
    the instance was busy leaves as one batch (up to ``max_batch_size``) as soon as the instance is free; a
    request that finds it free runs alone at once."""

    name = "tfserving-nowait"
    params = {
        "max_batch_size": "largest batch TF-Serving forms (E2bird: 32)",
        "max_queue_delay_ms": "batch_timeout_micros in ms: fixed at 0 for NO_Wait",
    }

    def __init__(self, max_batch_size=None, max_queue_delay_ms=0.0):
        if isinstance(max_queue_delay_ms, bool) or max_queue_delay_ms not in (0, 0.0):
            raise ConfigError("policy.max_queue_delay_ms",
                              f"{self.name} has no batch timeout (0); use tfserving-optwait for a timeout > 0, "
                              f"got {max_queue_delay_ms!r}")
        super().__init__(max_batch_size, 0.0)


@register
class TFServingOptWait(_TFServing):
    """E2bird's ``OPT_Wait`` (TF-Serving with a tuned ``batch_timeout_micros``; E2bird: 30 ms, max batch 32): a
    batch leaves when it holds ``max_batch_size`` requests or when its oldest request has waited
    ``max_queue_delay_ms``, and an instance is free. E2bird found 30 ms by TF-Serving's tuning guide for ResNet-152
    on its GPU; for another model or device the optimum differs (sweep ``policy.max_queue_delay_ms``)."""

    name = "tfserving-optwait"
    params = {
        "max_batch_size": "largest batch TF-Serving forms (E2bird: 32)",
        "max_queue_delay_ms": "batch_timeout_micros in ms (E2bird's tuned value: 30)",
    }
    default_delay_ms = 30.0


@register
class TFServingStatic(TFServingOptWait):
    """E2bird's ``Static``: ``OPT_Wait``, but every batch is padded with dummy inferences to ``max_batch_size``
    (TF-Serving's ``allowed_batch_sizes = [max_batch_size]``), so every batch takes batch ``max_batch_size``'s time
    and device demand whatever number of real requests it holds.

    How it is modelled: batches are formed exactly as by ``tfserving-optwait``; the pipeline charges every stage
    execution the table's latency and demand at ``pad_to_batch_size`` (= ``max_batch_size``) instead of its real
    size (see :meth:`dvasim.core.pipeline.Pipeline._begin`). Records keep the real batch size. Assumed where E2bird
    is silent: the dummy rows are not queries (they are not counted anywhere); only the simulator's latency table
    honours the padding (a host model's own ``gpu_table`` and the real replay run the real rows only)."""

    name = "tfserving-static"

    @property
    def pad_to_batch_size(self) -> int:
        return self.max_batch_size


# ----------------------------------------------------------------------------- LazyBatching's baselines (HPCA'21)
@register
class Serial(_PeerBatcher):
    """LazyBatching's ``Serial`` baseline: no batching. Each instance takes the oldest waiting request as soon as it
    is free and runs it alone through the whole model; the others wait in arrival order.

    Assumed where the paper is silent: with several instances each runs one request at a time (the paper has one
    accelerator and one request in flight). ``max_batch_size`` is accepted only as 1 (so that configs shared with
    batching policies can name it)."""

    name = "serial"
    params = {"max_batch_size": "fixed at 1: no batching"}

    def __init__(self, max_batch_size=1):
        if isinstance(max_batch_size, bool) or max_batch_size != 1:
            raise ConfigError("policy.max_batch_size", f"serial runs one request at a time (1), got {max_batch_size!r}")
        super().__init__(1, 0.0)


@register
class GraphBatch(_PeerBatcher):
    """LazyBatching's ``GraphB(N)`` baseline: graph batching with a batching time-window of ``window_ms`` (N) and a
    model-allowed maximum batch size (the paper's default: 64). Inputs are batched at the front door only and the
    batch runs the whole graph; requests that arrive meanwhile wait for it to finish (the paper's Figure 6(a)).

    Semantics: a batch leaves when ``max_batch_size`` requests wait, or when the oldest waiting request has waited
    ``window_ms``, and an instance is free. Assumed where the paper is silent: the window is counted from the oldest
    waiting request's arrival (as in TF-Serving and Triton, the systems the paper's baseline stands for); the
    default window is 5 ms (the smallest of the paper's Figure 5, which sweeps 5 to 99 ms)."""

    name = "graphbatch"
    params = {
        "max_batch_size": "the model-allowed maximum batch size (LazyBatching: 64)",
        "window_ms": "the batching time-window N of GraphB(N), in ms",
    }
    default_max_batch_size = 64

    def __init__(self, max_batch_size=None, window_ms=5.0):
        window = check_nonneg_number("policy.window_ms", window_ms)
        if max_batch_size is not None:
            check_positive_int("policy.max_batch_size", max_batch_size)
        super().__init__(max_batch_size, window)

    @property
    def window_ms(self) -> float:
        return self.max_queue_delay_ms
