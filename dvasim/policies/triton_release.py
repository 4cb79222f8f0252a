"""Triton's instance pipeline as a release's code runs it: the payloads the dynamic batcher forms ahead of busy
instances, whether a queued payload still grows, the merge at dequeue, and the TensorRT backend that frees an
instance when its batch's inputs are consumed, so that the next batch waits on the instance's CUDA stream.

A *release* names which code is modelled (``[server] triton_release``, or the stack's own: ``triton-tensorrt-21.10``
runs ``"21.10"``, ``triton-tensorrt`` ``"current"``, every other stack ``"ideal"``):

``"ideal"``
    dvasim's idealised batcher (what every Triton run was before): a batch is formed only when an instance holds no
    batch, and an instance is free only when its batch has left the last stage. No prefetch, no stream queue.

``"21.10"``
    Triton r21.10 (the DVABatch paper's release: §8.1, Table 1), server branch ``r21.10`` (commit 5e5db26c9d08) and
    tensorrt_backend branch ``r21.10`` (61925b32):

    * *prefetch*: the batcher forms the next payload while fewer than ``2 x instances`` payloads wait in the model's
      queue (``src/core/rate_limiter.cc:116-127`` ``PayloadSlotAvailable``: ``queue_->Size() < 2 *
      specific_queues_.size()``; the batcher blocks on it, ``src/core/dynamic_batch_scheduler.cc:308``); payloads an
      instance already executes do not count;
    * *frozen payloads*: enqueueing sets the payload SCHEDULED (``rate_limiter.cc:354``) and ``IsStaleState``
      counts SCHEDULED as stale (``dynamic_batch_scheduler.cc:42-49``), so the next loop starts a new payload
      (``:283-289``): a queued payload never grows;
    * *merge at dequeue*: an instance that dequeues a payload merges the payloads behind it, each of which has itself
      waited longer than the queue delay (from its oldest request), while the total stays within
      ``max_batch_size``, and only when ``max_queue_delay_microseconds > 0`` and ``max_batch_size > 1``
      (``src/core/instance_queue.cc:66-89``); preferred sizes play no part;
    * *inputs consumed*: the TensorRT backend's ``ProcessRequests`` ends with ``context_queue_.Get()``
      (tensorrt_backend ``src/tensorrt.cc:1596-1597``), a token given back when the batch's inputs are consumed
      (``cudaEventSynchronize(ready_for_input_)``, ``:2491-2492``): one token per instance (``RegisterContexts``,
      ``:2915-2932``), two with ``eager_batching``. The instance's thread dequeues its next payload as soon as
      ``Execute`` returns (``src/backends/backend/triton_model_instance.cc:661-690``), and that payload waits on
      the instance's CUDA stream (``stream_``, ``:2825-2846``) behind the running batch;
    * one backend thread serves every instance of a model on a GPU (DEVICE_BLOCKING, ``tensorrt.cc:4955-4957``;
      ``triton_model_instance.cc:299-315``), giving payloads to instances in turn (``rate_limiter.cc:214-219``).

``"current"``
    Triton since r22.03 (core ``main``, 73aad7c3; tensorrt_backend ``main``, e2ef6d79), as above except:

    * *growing payloads*: server commit c9c7c0a94 "Grow batches till the payload is under execution" (#3789, in
      r22.01) drops SCHEDULED from ``IsStaleState`` (core ``src/dynamic_batch_scheduler.cc:42-48``), so the queued
      payload keeps absorbing requests until an instance takes it, unless it is saturated (it reached the largest
      preferred size, core ``:613-616``, or a preferred size with no queue delay, ``:596-599``); a non-saturated
      payload not at a preferred size absorbs the pending requests at once (1769e08a2, r22.03; core ``:636-645``).
      (r22.01-r22.02 never reset ``saturated_``, which disabled the merge at dequeue; that bug is not modelled.)
    * saturated payloads are not merged at dequeue (core ``src/instance_queue.cc:71-72, 81-84``);
    * with a queue policy (a queue size limit, a timeout or priority levels) there is no prefetch: a payload is
      formed only when a backend thread waits for one (core ``src/rate_limiter.cc:230-236``,
      ``src/scheduler_utils.cc:364-375``);
    * the semaphore acquired after ``ProcessRequests`` ("form the batch as late as possible", tensorrt_backend
      ``src/tensorrt.cc:408-412``) is released at inputs-consumed (``src/instance_state.cc:1662, 1671``): one
      permit, three with ``eager_batching`` (``EVENT_SET_COUNT = 3``, ``src/instance_state.h:45-48``, since r23.03).

``"24.10"``
    Triton r24.10 (tritonserver 2.51.0, what the nvidia-pytriton 0.7.0 wheel bundles): core branch ``r24.10``
    (bfec7c61dc09) and the Python backend (python_backend branch ``r24.10``, 01d0ad82f9f5), whose instance is free
    only when its batch has left. Core ``src/dynamic_batch_scheduler.cc``, ``src/instance_queue.cc``,
    ``src/rate_limiter.cc``, ``src/scheduler_utils.cc`` and ``src/payload.cc`` at r24.10 are main 73aad7c3's but
    for the response delegator (``dynamic_batch_scheduler.cc:672-744``, which forms no batch), so the batcher's
    rules are the code's of ``"current"``; where ``"24.10"`` departs from ``"current"`` it is where dvasim's
    ``"current"`` departs from that code (kept, bit for bit, for its runs), or in the backend. Rule by rule:

    * *prefetch* as ``"current"``: payloads are formed while the model's queue holds fewer than ``2 x instances``
      (core r24.10 ``src/rate_limiter.cc:207-229``, the batcher blocking on it at
      ``src/dynamic_batch_scheduler.cc:367, 449-485``);
    * *no prefetch with a queue policy*, where "queue policy" is what the code tests
      (``src/scheduler_utils.cc:361-376``): priority levels, or a default policy with a timeout, a queue size
      limit or ``allow_timeout_override = true`` (the last alone turns prefetch off too; ``"current"`` ignores it).
      Without prefetch a payload is formed only while an instance's thread waits for one (``rate_limiter.cc:
      230-236``: ``WaitingConsumerCount > 0``, counted up at ``:317-320`` and down at ``:259-262``);
    * *growing payloads* as ``"current"``: ``IsStaleState`` is EXECUTING or RELEASED only
      (``dynamic_batch_scheduler.cc:42-48``), a payload stops growing when the batcher marks itself saturated
      (``payload_saturated_``, ``:545, 598, 615``) and a non-saturated payload not at a preferred size absorbs the
      pending requests at once (``:641-645``), whenever the batcher runs (see *the batcher thread runs only when
      woken*, below);
    * *merge at dequeue of saturated payloads*: ``InstanceQueue::Dequeue`` (``src/instance_queue.cc:57-104``)
      skips a payload only if the payload's own flag ``IsSaturated()`` is set (``:71-72, 81-82``), and that flag
      is set only by ``Payload::MarkSaturated`` (``src/payload.cc:158-162``), called only when a request's input
      shapes differ from the batch's (``dynamic_batch_scheduler.cc:555-560``) or a custom batching library
      refuses it (``:564-571``); the batcher's saturation (``payload_saturated_`` above) never reaches the
      payload. So a payload that reached a preferred size is merged like any other: behind the dequeued payload,
      each payload older than the queue delay (``BatcherStartNs``, strictly, ``:83-84``; ``payload.cc:130-138``)
      while the total fits ``max_batch_size`` (``:89``), only with a delay > 0 and ``max_batch_size > 1``
      (``:71-72``). (dvasim models neither shape checks nor custom batching: here no payload is ever skipped.)
      The same holds at main 73aad7c3, whose ``instance_queue.cc`` is identical: ``"current"``'s skip is kept
      unchanged for its runs' sake, though the code does not do it;
    * *an aged payload too large to merge stops growing*: the merge marks the front payload EXECUTING before it
      checks the size (``instance_queue.cc:85-89``), so when it does not fit it stays queued as EXECUTING, which
      ``IsStaleState`` counts (``dynamic_batch_scheduler.cc:342-347, 373-376``): the batcher starts a new payload;
    * *the instance's release* (Python backend): one backend thread per instance (the backend sets no
      DEVICE_BLOCKING policy, so ``ShareBackendThread`` is false, core ``src/backend_model_instance.h:145-149``,
      ``src/backend_model_instance.cc:327-351``), one stub process per instance (python_backend
      ``src/python_be.cc:2238-2278, 327-346``). ``ProcessRequests`` hands the batch to the stub and blocks until
      the stub's ``execute()`` has returned its responses (``python_be.cc:1338-1345``), sends them
      (``TRITONBACKEND_ResponseSend`` in ``InferResponse::Send``, ``src/infer_response.cc:226-233``, called at
      ``python_be.cc:1514-1517``; GPU outputs after a second round trip, ``:1528-1591``), and
      ``TRITONBACKEND_ModelInstanceExecute`` releases the requests and returns (``:2305-2376``); only then does
      the instance's thread release the payload and dequeue the next (core ``backend_model_instance.cc:796-805``).
      So an instance takes its next payload only when its batch has left the last stage (the ``"ideal"``
      release of an instance, with Triton's payload queue in front of it). ``eager_batching`` (TensorRT's) has no
      effect. Several idle instances: the lowest-numbered takes the payload (Triton wakes one waiting thread,
      ``rate_limiter.cc:271-276``, whichever the OS picks).
    * *the race at an instance's finish* (``lost_wakeup``, on; ``grow_at_finish``, off). An instance that finishes
      notifies the batcher's ``cv_`` from ``Payload::Execute`` (``payload.cc:214-216``, the callback set at
      ``dynamic_batch_scheduler.cc:430-432``) *before* its thread releases the payload and returns to
      ``DequeuePayload`` (``backend_model_instance.cc:801-804``, then ``:798``), where it counts itself a waiting
      consumer (``rate_limiter.cc:317-320``; that notifies only ``waiting_consumer_cv_``,
      ``instance_queue.cc:106-114``, not ``cv_``) and then takes the queued payload (``instance_queue.cc:63-67``,
      under the payload's exec mutex, which the batcher holds while it grows it, ``dynamic_batch_scheduler.cc:
      369-419``). Which thread gets there first the code leaves open (an OS race). Without prefetch (a queue
      policy), a batcher that runs first finds no waiting consumer (``rate_limiter.cc:230-234``) and sleeps in
      ``WaitForPayloadSlotAvailable`` (``dynamic_batch_scheduler.cc:449-485``) until an arrival that passes its gate
      (``:263-286``; a request refused by a full queue returns at ``:261`` and wakes nothing), another instance
      that takes a payload or finishes, or its deadline: ``wait_for`` with a predicate keeps its deadline, 500 ms
      after it began waiting (``:329, 367, 464``), and past it the loop waits 500 ms more (``:463-481``). That is
      ``lost_wakeup``, on in ``"24.10"``: in the real r24.10 runs (tritonserver 2.51.0, one instance, Python
      backend) the next batch started a median 0.06-0.07 ms after the next arrival, not at the instance's release,
      for 63-65% of the batches of priority_2_700 and 59-68% of timeout_20ms_1000 (the two runs of each; a batch
      counted when it started within 0.2 ms of an arrival and over 0.3 ms after the previous COMPUTE_END); the
      priority runs ended with a batch that waited ~500 ms, and queue_size_8_1000 (full queue) stalled ~500 ms 6
      times in 27 executions. The batcher lost the race most of the time, so ``"24.10"`` always lets it lose.
      With prefetch the same order (``grow_at_finish``) would let the batcher grow the queued payload with every
      queued request before the instance takes it; in the real DelayBatch runs the instance's thread took the
      queued payload first in 54-59% of the finishes (requests that arrived late in the previous batch were left
      for the batch after: delay_1ms_600, delay_2ms_800), so ``grow_at_finish`` is off (the instance's thread
      takes the payload first). The real outcome there depends on the finishing batch's size (the batcher ran
      first after 62-100% of the batches of 1-2 requests, after 5-7% of those of 9-12: the CPU time the
      server's and client's threads spend on the answers of a large batch, on that 2-core machine), which the
      code does not decide and which is not modelled; it is what makes the real batch sizes alternate.
    * *the batcher thread runs only when woken* (``wake_gate``; the same code at main, which ``"current"`` does not
      model: its batcher looks at every arrival). The batcher thread's loop (``dynamic_batch_scheduler.cc:
      331-443``) starts a new payload when its payload is saturated (``payload_saturated_``) or stale (taken:
      EXECUTING or RELEASED), resetting ``next_preferred_batch_size_`` to 0 (``:341-347``; ``NewPayload``,
      ``:292-299``); with no request queued it waits 500 ms (``:329, 360-361``); else it waits for a payload slot
      (``:367``, ``WaitForPayloadSlotAvailable``, ``:449-485``), runs ``GetDynamicBatch`` (``:379``) and either
      moves the requests it chose into the payload (``:386-418``; a new one is enqueued, ``:430-438``, with a
      callback that notifies the batcher, ``:431``) and loops at once, or waits (``wait_for``, ``:422-427``) until
      the oldest walked request's delay expires (``:647-669``). It is notified (``cv_``) by an arrival only if a
      payload slot is free and its payload is saturated, stale, or the requests queued outside any payload number
      at least ``next_preferred_batch_size_`` (``:253-287``); by an instance's thread that takes a payload
      (``rate_limiter.cc:354-355``) and by one that finishes its batch (``payload.cc:214-216``). When it runs,
      ``GetDynamicBatch`` (``:487-670``) walks the queued requests on top of the payload's size: a new payload
      that cannot leave yet (no preferred size reached, delay not passed) sets ``next_preferred_batch_size_`` to
      the smallest preferred size above the walk (``:623-634``) and waits, so later arrivals do not wake the
      batcher until that many are queued, and the payload it then sends keeps that value; a queued payload not at
      a preferred size absorbs the walk at once (``:636-645``), ``next_preferred_batch_size_`` becoming the next
      preferred size above the walk less the payload's size before it (``:623-634``), so after one growth a
      payload far below ``max_batch_size`` is frozen until an instance takes it or finishes; a queued payload at a
      preferred size grows to the next preferred size the walk reaches (``:578-582, 594-603``), and past the
      largest one it saturates and takes one request within the delay (``:540-546`` mark the best size at 0,
      then at 1; ``:596-602`` send it) or the whole walk up to ``max_batch_size`` once the oldest walked request's
      delay has passed (``:611-617``). Under a delay a payload sent at a preferred size is not saturated
      (``:596-602``); with no delay ``next_preferred_batch_size_`` is never set (the function returns before
      ``:623``), so every arrival with a free slot wakes the batcher. Modelled as the code runs it, for requests
      of batch size 1 and no shape checks (``enforce_equal_shape_tensors_`` empty, ``:275``): a new payload's size
      is the policy's rule (``_form_size``; Triton's own for policy ``triton``, and ``delaybatch``'s agrees with
      the walk on when to wait).

Where this differs from the code, on purpose: the instance's host work for a batch waiting on the stream (its
inputs' copy) is charged when the batch starts, after the batch before it (the host model's batch entry), not
beside it; inputs are taken as consumed when the batch starts its first stage; in ``"current"`` the payload of a
growing release that reached a smaller preferred size under a queue delay is taken as saturated, and its batcher
looks at every arrival (``"24.10"`` runs the code's gate and growth, above). Under ``wake_gate``: at an instant
where an instance finishes or takes a payload, its thread takes the queued payload before the woken batcher runs
(with prefetch; see *the race at an instance's finish*); the batcher's 500 ms idle wait is not a decision of its
own (it ends at the next decision after it), though its 500 ms wait for a payload slot is, for the queue-policy
batcher (``TritonServerBatcher.next_wakeup``; DelayBatch and ZeroBatch have prefetch, so never lose a wake-up); request
timeouts (a queue policy's) do not wake it; DVABatch's backend (``take``) runs the ungated batcher. With several instances the one backend thread blocks on the instance it gave its last payload
to until that instance has fewer than its tokens of batches waiting on its stream (exact for one instance, the
common case; current releases rotate a per-device semaphore, ``model_state.cc:59-74``, which this approximates).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from itertools import islice

from dvasim.core.operations import time_eps
from dvasim.errors import ConfigError

RELEASES = ("ideal", "21.10", "current", "24.10")


@dataclass(frozen=True)
class ReleaseRules:
    """What a release's code does (see the module docstring for the lines each comes from)."""

    name: str
    prefetch_slots_per_instance: int = 2  # payloads formed ahead: queue < slots x instances (0: none, "ideal")
    frozen: bool = True  # a queued payload never grows (r21.10)
    tokens: int = 1  # batches an instance may have issued whose inputs are not consumed yet
    skip_saturated_merge: bool = False  # saturated payloads are not merged at dequeue (current)
    prefetch_with_queue_policy: bool = True  # current: no prefetch when a queue policy is set
    override_stops_prefetch: bool = False  # 24.10: allow_timeout_override alone is a queue policy (no prefetch)
    freeze_unmerged: bool = False  # 24.10: an aged payload too large to merge stops growing
    release_at_exit: bool = False  # 24.10: an instance takes its next payload when its batch has left (Python)
    wake_gate: bool = False  # 24.10: the batcher runs only when woken (arrival gate, instance, timer); code's growth
    # wake_gate: at an instance's finish the batcher, notified first (payload.cc:214-216), runs before that
    # instance's thread returns to DequeuePayload (backend_model_instance.cc:798-804): without prefetch it finds no
    # waiting consumer and sleeps until an arrival passes its gate or its 500 ms deadline ("lost wake-up")
    lost_wakeup: bool = False
    # the same order with prefetch on: the notified batcher grows the queued payload before the instance takes it
    grow_at_finish: bool = False

    @property
    def ideal(self) -> bool:
        return self.prefetch_slots_per_instance == 0


def release_rules(name: str, eager_batching: bool = False, field_name: str = "server.triton_release") -> ReleaseRules:
    """The rules of release ``name`` (one of :data:`RELEASES`), with TensorRT's ``eager_batching`` on or off."""
    if name not in RELEASES:
        raise ConfigError(field_name, f"unknown Triton release {name!r}; allowed: {', '.join(RELEASES)}")
    if name == "ideal":
        return ReleaseRules("ideal", prefetch_slots_per_instance=0, frozen=True, tokens=0)
    if name == "21.10":
        return ReleaseRules("21.10", frozen=True, tokens=2 if eager_batching else 1)
    if name == "24.10":  # the Python backend: no tokens, no eager batching (see the module docstring)
        return ReleaseRules("24.10", frozen=False, tokens=0, skip_saturated_merge=False,
                            prefetch_with_queue_policy=False, override_stops_prefetch=True, freeze_unmerged=True,
                            release_at_exit=True, wake_gate=True, lost_wakeup=True, grow_at_finish=False)
    return ReleaseRules("current", frozen=False, tokens=3 if eager_batching else 1, skip_saturated_merge=True,
                        prefetch_with_queue_policy=False)


@dataclass(eq=False)
class Payload:
    """A batch the batcher formed: its requests (in order), whether it is saturated (takes no more) and when its
    oldest request reached the batcher (the merge's age, ``Payload::QueueStartNs``, payload.cc:111-118)."""

    queries: list
    saturated: bool = True
    oldest: float = math.inf

    def __post_init__(self) -> None:
        self.oldest = min((q.seen for q in self.queries), default=math.inf)

    def add(self, queries: list) -> None:
        self.queries.extend(queries)
        self.oldest = min([self.oldest, *(q.seen for q in queries)])


@dataclass(eq=False)
class InstancePipeline:
    """The payload queue, the instances' streams and the backend thread of one Triton model (see the module
    docstring). ``batcher`` is the dynamic batcher: it answers ``_form_size(now)`` (how many pending requests a
    payload formed now takes; 0: wait) and ``_take_n(n)`` (those requests), and has ``max_batch_size``,
    ``max_queue_delay_ms`` and ``_preferred_sizes()``."""

    rules: ReleaseRules
    batcher: object
    n_instances: int
    queue: deque = field(default_factory=deque)  # the model's queue of payloads no instance took yet
    streams: list = field(default_factory=list)  # per instance: payloads issued, waiting on its stream
    turn: int = 0  # the instance the backend thread gives the next payload to (round robin)
    last: int = -1  # the instance the thread gave its last payload to (-1: none yet)
    # a backend other than TensorRT's (the DVABatch backend): whether its thread has returned from Execute and
    # takes the next payload (None: the TensorRT backend's tokens and streams, above)
    backend_free: object = None
    # the instances whose stream runs a batch, as the last ``step`` left them (what ``release_at_exit`` reads)
    busy: set = field(default_factory=set)
    # ``wake_gate``: the batcher thread's own state (dynamic_batch_scheduler.cc): its current payload
    # (``curr_payload_``; None: a new one, no request moved yet), ``payload_saturated_``,
    # ``next_preferred_batch_size_``, when its ``wait_for`` expires (inf: it waits for a notification only), and
    # what the last ``step`` left: the requests queued (``queued_batch_size_``), the busy instances and its time
    current: Payload | None = None
    current_saturated: bool = False
    next_preferred: int = 0
    batcher_due: float = math.inf
    queued: int = 0
    was_busy: set = field(default_factory=set)
    last_step: float = -math.inf
    slot_wait_since: float | None = None  # when the batcher began to wait for a payload slot (None: it does not)

    def __post_init__(self) -> None:
        self.streams = [deque() for _ in range(self.n_instances)]

    # ---------------------------------------------------------------- state
    def holds_work(self) -> bool:
        return bool(self.queue) or any(self.streams)

    def thread_free(self) -> bool:
        """The backend thread has returned from its last ``Execute``: that instance has fewer than its tokens of
        batches waiting on its stream (or the other backend says its thread is free)."""
        if self.backend_free is not None:
            return bool(self.backend_free())
        if self.rules.release_at_exit:
            return self._idle() >= 0
        return self.last < 0 or len(self.streams[self.last]) < self.rules.tokens

    def _idle(self) -> int:
        """``release_at_exit``: the first instance that holds no batch, whose thread waits for a payload (-1: none;
        Triton wakes one waiting thread, r24.10 core rate_limiter.cc:271-276)."""
        for i in range(self.n_instances):
            if i not in self.busy and not self.streams[i]:
                return i
        return -1

    def slot_free(self) -> bool:
        """The batcher may form (or grow) a payload now (``PayloadSlotAvailable``)."""
        if self.rules.ideal or (not self.rules.prefetch_with_queue_policy and self._queue_policy()):
            return not self.queue and self.thread_free()  # no prefetch: only for a waiting backend thread
        return len(self.queue) < self.rules.prefetch_slots_per_instance * self.n_instances

    def _queue_policy(self) -> bool:
        """The batcher's queue turns prefetch off (current: core scheduler_utils.cc:364-375; 24.10 counts
        ``allow_timeout_override`` too, r24.10 scheduler_utils.cc:364-367)."""
        b = self.batcher
        return bool(b.has_queue_policy()) or (self.rules.override_stops_prefetch
                                               and bool(getattr(b, "allow_timeout_override", False)))

    # ---------------------------------------------------------------- one decision
    def step(self, now: float, busy: set[int]) -> list[tuple[int, list]]:
        """What happens now, until nothing more can: the batches that start on an instance (``(instance,
        queries)``, in order). ``busy``: the instances whose stream runs a batch (updated)."""
        started: list[tuple[int, list]] = []
        gate = self.rules.wake_gate
        done = (self.was_busy - busy) if gate else set()
        finished = bool(done)
        self.busy = busy
        awake = self._woken(now, finished) if gate else False
        if awake and finished and self._batcher_first():
            # payload.cc:214-216 notifies the batcher before the finishing instance's thread releases its payload
            # and returns to DequeuePayload (backend_model_instance.cc:801-804, 798): the batcher runs while that
            # thread neither waits as a consumer (rate_limiter.cc:317-320) nor has taken the queued payload
            self.busy = busy | done
            try:
                while self._gate_step(now):
                    pass
            finally:
                self.busy = busy
            # the thread's count increment notifies only waiting_consumer_cv_ (instance_queue.cc:106-114): the
            # batcher sleeps on until an instance takes a payload, an arrival passes its gate, or its deadline
            awake = False
        while True:
            moved = False
            for i, stream in enumerate(self.streams):  # inputs consumed: the stream's next batch starts
                if stream and i not in busy:
                    started.append((i, stream.popleft().queries))
                    busy.add(i)
                    moved = True
            if self.queue and self.thread_free():  # the backend thread takes the next payload
                if self.rules.release_at_exit:  # an idle instance's own thread (24.10, the Python backend)
                    i = self._idle()
                else:
                    i = self.turn
                    self.turn = (self.turn + 1) % self.n_instances
                    self.last = i
                self.streams[i].append(self._dequeue(now))
                awake = True  # wake_gate: the payload's callback notifies the batcher (rate_limiter.cc:354-355)
                moved = True
                continue
            if gate:
                if awake:
                    if self._gate_step(now):
                        moved = True
                    else:
                        awake = False  # it waits (until notified, or its wait_for expires)
            elif self._batcher_step(now):
                moved = True
            if not moved:
                if gate:
                    self.queued = int(self.batcher.pending_count())
                    self.was_busy = set(busy)
                    self.last_step = now
                return started

    def take(self, now: float) -> Payload | None:
        """For a backend of its own (``backend_free``): run the batcher until the backend's thread, if free, takes
        the next payload (returned), or nothing more moves (None)."""
        while True:
            if self.queue and self.thread_free():
                return self._dequeue(now)
            if not self._batcher_step(now):
                return None

    def _dequeue(self, now: float) -> Payload:
        """``InstanceQueue::Dequeue`` (instance_queue.cc:56-95): the front payload, and behind it every payload
        that has itself waited longer than the queue delay (strictly) while the total fits ``max_batch_size``;
        current releases merge no saturated payload (core instance_queue.cc:71-72, 81-84); under 24.10 an aged
        payload that does not fit stops growing (r24.10 instance_queue.cc:85-89)."""
        b = self.batcher
        p = self.queue.popleft()
        skip = self.rules.skip_saturated_merge
        if b.max_queue_delay_ms > 0 and b.max_batch_size > 1 and not (skip and p.saturated):
            size = len(p.queries)
            while self.queue:
                nxt = self.queue[0]
                if (skip and nxt.saturated) or not now - nxt.oldest > b.max_queue_delay_ms:
                    break
                if size + len(nxt.queries) > b.max_batch_size:
                    if self.rules.freeze_unmerged:
                        nxt.saturated = True  # left queued as EXECUTING: the batcher starts a new payload
                    break
                self.queue.popleft()
                p.add(nxt.queries)
                size += len(nxt.queries)
        p.saturated = True  # EXECUTING: it takes no more
        return p

    def _batcher_step(self, now: float) -> bool:
        """The batcher's loop once: grow the queued payload it is still building (current releases), or form a new
        payload by its rule when a slot is free. True if a request moved."""
        b = self.batcher
        if not b.has_requests() or not self.slot_free():
            return False
        if not self.rules.frozen and self.queue and not self.queue[-1].saturated:
            p = self.queue[-1]  # the batcher's current payload, still queued: it grows (#3789)
            top = max(b._preferred_sizes())
            n = min(b.pending_count(), top - len(p.queries))
            if n <= 0:
                p.saturated = True
                return False
            p.add(b._take_n(n))
            self._saturate(p)
            return True
        n = b._form_size(now)
        if n <= 0:
            return False
        p = Payload(b._take_n(n))
        if self.rules.frozen:
            p.saturated = True
        else:
            p.saturated = False
            self._saturate(p)
        self.queue.append(p)
        return True

    # ---------------------------------------------------------------- wake_gate (r24.10's batcher thread)
    def _batcher_first(self) -> bool:
        """Does the batcher, notified by an instance's finish, run before that instance's thread (``lost_wakeup``
        without prefetch, ``grow_at_finish`` with it)?"""
        if self.rules.ideal or (not self.rules.prefetch_with_queue_policy and self._queue_policy()):
            return self.rules.lost_wakeup
        return self.rules.grow_at_finish

    def slot_deadline(self, now: float) -> float:
        """When the batcher, waiting for a payload slot, next re-checks on its own (its 500 ms ``wait_for``,
        dynamic_batch_scheduler.cc:329, 367, 463-468; inf when it is not waiting for a slot or the time is past)."""
        if self.slot_wait_since is None or not self.batcher_due > now + time_eps(now):
            return math.inf
        return self.batcher_due

    def _woken(self, now: float, finished: bool) -> bool:
        """``wake_gate``: does the batcher thread run at this decision, before any instance moves? It does when an
        instance finished its batch (``Payload::Execute``'s callback, payload.cc:214-216), when its own
        ``wait_for`` expires (dynamic_batch_scheduler.cc:424-427), or when a request arrived and the arrival gate
        lets it through (``:263-286``): a payload slot is free and the batcher's payload is saturated, stale, or
        ``queued_batch_size_ >= next_preferred_batch_size_``. (An instance that takes a payload wakes it too: see
        ``step``.)"""
        if finished or now >= self.batcher_due - time_eps(now):
            return True
        b = self.batcher
        n = int(b.pending_count())
        arrived = n > self.queued or (now > self.last_step and bool(b.has_queue_policy())
                                      and any(q.seen == now for q in b.pending))  # (a timeout may have left)
        if not arrived or not self.slot_free():
            return False
        cur = self.current
        return self.current_saturated or (cur is not None and self._stale(cur)) or n >= self.next_preferred

    def _stale(self, p: Payload) -> bool:
        """``IsStaleState``: an instance took the payload (EXECUTING, or merged and RELEASED), or a merge left it
        queued as EXECUTING (``freeze_unmerged``)."""
        return p.saturated or not any(x is p for x in self.queue)

    def _gate_step(self, now: float) -> bool:
        """``wake_gate``: the batcher thread's loop (dynamic_batch_scheduler.cc:331-443) from a wake-up until it
        moves requests into a payload (True: it loops again at once) or waits (False; ``batcher_due`` set)."""
        b = self.batcher
        while True:
            cur = self.current
            if cur is not None and (self.current_saturated or self._stale(cur)):  # :341-347
                self.current, self.current_saturated, self.next_preferred = None, False, 0
                cur = None
            if not b.has_requests():  # :360-361: the default wait, 500 ms (:329)
                self.batcher_due = now + 500.0
                self.slot_wait_since = None
                return False
            if not self.slot_free():  # :367, 449-485: until a notification finds a slot, or its deadline
                if self.slot_wait_since is None:
                    self.slot_wait_since = now
                # wait_for with a predicate keeps its deadline across notifications; past it, the loop at :463
                # waits 500 ms more (:464-468): the next multiple of 500 ms after it began, strictly after now
                since = self.slot_wait_since
                self.batcher_due = since + 500.0 * (math.floor((now - since) / 500.0) + 1)
                return False
            self.slot_wait_since = None
            size = 0 if cur is None else len(cur.queries)
            take, due = self._dynamic_batch(now, size)
            if due < math.inf:  # :422-427
                self.batcher_due = due
                return False
            if cur is None:  # a new payload, READY, enqueued (:412-414, 430-438)
                n = int(b._form_size(now))  # the policy's own size rule (it agrees with the walk on waiting)
                p = Payload(b._take_n(n if n > 0 else take))
                p.saturated = False
                self.current = p
                self.queue.append(p)
                return True
            if take > 0:  # the queued payload grows (:386-418)
                cur.add(b._take_n(take))
                return True
            if not self.current_saturated:  # (not reached: taking nothing saturates)
                self.batcher_due = math.inf
                return False

    def _dynamic_batch(self, now: float, size: int) -> tuple[int, float]:
        """``GetDynamicBatch`` (dynamic_batch_scheduler.cc:487-670) for a payload of ``size`` requests and the
        queued requests (each of batch size 1, no shape checks): how many move into the payload and when the
        batcher waits until (inf: it does not wait). Sets ``current_saturated`` (``payload_saturated_``, :545,
        598, 615) and ``next_preferred`` (:623-634) as the code does."""
        b = self.batcher
        prefs = sorted(set(b._preferred_sizes()))
        top, mbs, delay = prefs[-1], int(b.max_batch_size), float(b.max_queue_delay_ms)
        best, pend, send_now = 0, 0, False
        for _ in range(min(int(b.pending_count()), mbs - size + 1)):  # the walk, :518-583
            if size + pend > 0:  # a request joining a batch under way (:535-551)
                if size + pend + 1 > top and best == 0:  # past every preferred size: mark here, saturate
                    best = pend
                    self.current_saturated = True
                if size + pend + 1 > mbs:
                    send_now = True
                    break
            pend += 1
            if size + pend in prefs:  # :578-582
                best = pend
        oldest = min((q.seen for q in islice(b.pending, pend)), default=-math.inf)
        exceeded = delay > 0 and now - oldest >= delay - time_eps(now)  # :585-592
        if best and not exceeded:  # :594-603
            if delay == 0:
                self.current_saturated = True
            return best, math.inf
        if pend == 0:  # :605-609
            return 0, math.inf
        if send_now or size + pend >= top:  # :611-617
            self.current_saturated = True
            return pend, math.inf
        if exceeded or delay == 0:  # :619-621
            return pend, math.inf
        self.next_preferred = next(s for s in prefs if s > size + pend) - size  # :623-634 (one exists: < top)
        if not self.current_saturated and size and size not in prefs:  # :636-645
            return pend, math.inf
        return 0, oldest + delay  # :647-669

    def _saturate(self, p: Payload) -> None:
        """A growing payload stops growing at the largest preferred size, or at any preferred size with no queue
        delay (core dynamic_batch_scheduler.cc:596-599, 613-616), or a smaller preferred size under a delay (ours)."""
        size = len(p.queries)
        if size in self.batcher._preferred_sizes() or size >= self.batcher.max_batch_size:
            p.saturated = True
