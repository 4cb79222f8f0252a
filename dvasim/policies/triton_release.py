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
      pending requests at once (``:641-645``);
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
    * *not modelled, a thread race* ("lost wake-up"): without prefetch, the batcher waits for a consumer in
      ``WaitForPayloadSlotAvailable`` (``dynamic_batch_scheduler.cc:449-485``) on its ``cv_`` with a deadline
      500 ms (``:329, 367``) after it began to wait. An instance that finishes notifies ``cv_`` from
      ``Payload::Execute`` (``payload.cc:214-216``, the callback set at ``dynamic_batch_scheduler.cc:430-432``)
      *before* its thread counts itself as a waiting consumer (``backend_model_instance.cc:798-804`` then
      ``rate_limiter.cc:317-320``), and counting up notifies only ``waiting_consumer_cv_``
      (``instance_queue.cc:106-114``), not ``cv_``. If the woken batcher evaluates its predicate before the
      instance's thread has counted itself, it sleeps on until its deadline (up to 500 ms) or until a request
      arrives (``:263-286``; a request refused by a full queue, ``:261``, wakes nothing). Whether that happens
      depends on which thread runs first: not deterministic, so it is not modelled (here the batcher sees the
      idle instance at once).
    * *not modelled, as in ``"current"`` (deterministic, the same code at main)*: under a queue delay with
      preferred sizes below ``max_batch_size``, the batcher does not mark a payload saturated when it sends it at a
      preferred size (``:596-602`` sets ``payload_saturated_`` only with no delay). The next time it runs
      ``GetDynamicBatch`` a payload below the largest preferred size grows to the next one that fits, and one at
      the largest takes one more request (``:540-546`` mark the best size at 0, then 1 request, and ``:596-602``
      sends it) or, once the oldest pending request's delay has passed, the whole walk up to ``max_batch_size``
      (``:613-616``); either way it is then saturated. And an arrival wakes the batcher only when a slot is free
      and it is saturated, stale, or ``queued_batch_size_ >= next_preferred_batch_size_`` (``:263-286``), the
      latter set while the batcher waits out a delay (``:623-634``) and reset only with a new payload
      (``:344-347``); with no delay it stays 0 and every arrival wakes it. Here, as in ``"current"``, the batcher
      looks at every arrival and a payload at a preferred size stops growing (see below).

Where this differs from the code, on purpose: the instance's host work for a batch waiting on the stream (its
inputs' copy) is charged when the batch starts, after the batch before it (the host model's batch entry), not
beside it; inputs are taken as consumed when the batch starts its first stage; the payload of a growing release
that reached a smaller preferred size under a queue delay is taken as saturated (Triton lets it absorb again when
the delay expires). With several instances the one backend thread blocks on the instance it gave its last payload
to until that instance has fewer than its tokens of batches waiting on its stream (exact for one instance, the
common case; current releases rotate a per-device semaphore, ``model_state.cc:59-74``, which this approximates).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

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
                            release_at_exit=True)
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
        self.busy = busy
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
                moved = True
                continue
            if self._batcher_step(now):
                moved = True
            if not moved:
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

    def _saturate(self, p: Payload) -> None:
        """A growing payload stops growing at the largest preferred size, or at any preferred size with no queue
        delay (core dynamic_batch_scheduler.cc:596-599, 613-616), or a smaller preferred size under a delay (ours)."""
        size = len(p.queries)
        if size in self.batcher._preferred_sizes() or size >= self.batcher.max_batch_size:
            p.saturated = True
