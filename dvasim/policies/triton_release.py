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

RELEASES = ("ideal", "21.10", "current")


@dataclass(frozen=True)
class ReleaseRules:
    """What a release's code does (see the module docstring for the lines each comes from)."""

    name: str
    prefetch_slots_per_instance: int = 2  # payloads formed ahead: queue < slots x instances (0: none, "ideal")
    frozen: bool = True  # a queued payload never grows (r21.10)
    tokens: int = 1  # batches an instance may have issued whose inputs are not consumed yet
    skip_saturated_merge: bool = False  # saturated payloads are not merged at dequeue (current)
    prefetch_with_queue_policy: bool = True  # current: no prefetch when a queue policy is set

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
        return self.last < 0 or len(self.streams[self.last]) < self.rules.tokens

    def slot_free(self) -> bool:
        """The batcher may form (or grow) a payload now (``PayloadSlotAvailable``)."""
        if self.rules.ideal or (not self.rules.prefetch_with_queue_policy and self.batcher.has_queue_policy()):
            return not self.queue and self.thread_free()  # no prefetch: only for a waiting backend thread
        return len(self.queue) < self.rules.prefetch_slots_per_instance * self.n_instances

    # ---------------------------------------------------------------- one decision
    def step(self, now: float, busy: set[int]) -> list[tuple[int, list]]:
        """What happens now, until nothing more can: the batches that start on an instance (``(instance,
        queries)``, in order). ``busy``: the instances whose stream runs a batch (updated)."""
        started: list[tuple[int, list]] = []
        while True:
            moved = False
            for i, stream in enumerate(self.streams):  # inputs consumed: the stream's next batch starts
                if stream and i not in busy:
                    started.append((i, stream.popleft().queries))
                    busy.add(i)
                    moved = True
            if self.queue and self.thread_free():  # the backend thread takes the next payload
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
        current releases merge no saturated payload (core instance_queue.cc:71-72, 81-84)."""
        b = self.batcher
        p = self.queue.popleft()
        skip = self.rules.skip_saturated_merge
        if b.max_queue_delay_ms > 0 and b.max_batch_size > 1 and not (skip and p.saturated):
            size = len(p.queries)
            while self.queue:
                nxt = self.queue[0]
                if (skip and nxt.saturated) or not now - nxt.oldest > b.max_queue_delay_ms \
                        or size + len(nxt.queries) > b.max_batch_size:
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
