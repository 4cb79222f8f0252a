"""DVABatch as its authors built it: their Triton backend (github sjtu-epcc/DVABatch, commit 3454810f, the
"lego" backend: ``src/lego_schedule.h``, ``src/lego.cc``, ``src/lego_model.cc``), under Triton's dynamic batcher
(§8.1: "DVABatch relies on Triton to batch the accepted queries"). Policy ``dvabatch-built`` (alias ``lego``);
``dvabatch`` is DVABatch as the paper describes it (§7).

**The front door is Triton's.** Triton's dynamic batcher (``max_batch_size``, ``max_queue_delay_ms``, the run's
Triton release: :mod:`dvasim.policies.triton_release`) forms the payloads; the backend's thread takes one when its
``Execute`` has returned (``TRITONBACKEND_ModelInstanceExecute``, lego.cc:2281-2310). It returns once the batch is
queued to stage 0 and the main thread holds its next buffer token (lego.cc:1084-1090): with ``buffer_set_size`` B
tokens per boundary (= ``[engine] buffer_pairs``) and S stages, at most ``(B-1)(S+1)+1`` batches are inside the
backend (tokens return at the next stage's dispatch, the last at GPU completion, lego.cc:1171-1204); with B = 1, or
under ``OPERATOR_DVA`` at any B, one (``HypbridDVAScheduler`` never resets its wanted token, lego_schedule.h:801-884,
so Execute waits for the batch to leave the last stage).

**The scheduler is chosen by hand** (``lego_config.schedule_option.scheduler_type``, lego_model.cc:133-153;
lego.cc:684-714); ``scheduler`` names it:

* ``NORMAL`` -- each Triton batch runs as one batch (``NomalScheduler``, lego_schedule.h:496);
* ``NORMAL_INPUT`` -- the same, padded to its longest input (lego_schedule.h:544-582);
* ``LOAD_DVA`` -- stretch (``LoadDVAScheduler::MainSchedule``, lego_schedule.h:609-660): a Triton batch of ``k``
  requests is appended whole to the *latest* batch (lego_schedule.h:629), or none of it, iff, all strict,
  ``bs + k < max_allow_merge_batchsize`` (:631-632), the furthest stage the batch has been dispatched into is below
  ``max_allow_merge_stage`` (:633-634; ``handled_stages_`` is set by ``Forward`` before the stage launches,
  :277-288 and lego.cc:1134-1147, so a stage counts once its execution has started), and ``now - created <
  max_allow_merge_ms`` (:635-636; ``compute_start_ns_`` is set when the batch is made, :214). The check is made
  once, when the backend takes the Triton batch; the newcomers catch up from stage 0 and run merged after the
  furthest stage (``Forward``, lego_schedule.h:277-288). There is no QoS rule in the code.
* ``INPUT_DVA`` -- buckets (``InputDVAScheduler``, lego_schedule.h:703-785): each request goes to the first
  ``preferred_seq_len`` boundary at or above its length (:758-780), each non-empty bucket is its own batch padded to
  its boundary (binding dims ``(len, bs)``, :751-756), queued in ascending order, never re-merged;
* ``OPERATOR_DVA`` -- stretch with the model's ``max_batch_size`` as the size limit (lego.cc:705-710) and the split
  (``HypbridDVAScheduler::StageSchedule``, lego_schedule.h:859-884): a whole batch of ``N`` about to enter stage
  ``s+1 < S-1`` with ``N >= 4 favor_per_stage[s+1]`` runs stage ``s+1`` as ``[0, 2f)`` then ``[2f, N)`` (f =
  ``favor_per_stage[s+1]``; ``Split``, :243-275) and is whole again after it (:880-882). One batch in flight.

**The code's defects, and what runs here (each tested):**

* the Triton batch after a split is never queued (the ``nullptr`` branch of ``MainSchedule``, lego_schedule.h:
  832-841, lego.cc:1091-1095): the instance hangs. Here it runs as a new batch (what the code evidently meant);
* the split-off requests are answered without outputs and never released (lego.cc:1159-1163, 1217-1248): here they
  leave with their re-merged batch;
* a second split at the stage right after a split drops the whole batch (lego_schedule.h:873-874): here a batch is
  not split at the boundary right after its split stage;
* "microseconds" is compared with nanosecond clocks (lego.cc:697, lego_schedule.h:30-35, 635-636), so the window
  is 1000 times shorter than named. ``merge_time_units = "as-named"`` (default) reads ``max_allow_merge_ms`` as
  the milliseconds the key names; ``"as-coded"`` divides it by 1000 as the code does;
* a length above every ``preferred_seq_len`` bucket maps to 0 (lego_schedule.h:767-780): here it is padded to its
  own length (a bucket of its own);
* sub-batches compute on rows from 0 (lego.cc:1147, 969) and buffer tokens return at dispatch, before the GPU has
  read (a possible write-after-read race with B >= 2): numerics only; the timing is modelled as the GPU runs it.

**Parameters the repository leaves unset** (it ships no configs; lego_model.cc sets no defaults) are derived
here, never fitted to a figure:

* ``favor_per_stage`` -- each stage's preferred batch size from the latency table (the smallest whose throughput
  reaches 90% of the stage's best, §3.2's definition; the same rule as ``dvabatch``);
* ``max_allow_merge_batchsize`` -- one more than the largest preferred batch size of the stages (strict ``<``: a
  stretched batch grows at most to the size that fully utilizes every stage, §3.3's "merged into a new batch that
  fully utilizes the hardware"), at most ``max_batch_size + 1``;
* ``max_allow_merge_stage`` -- ``ceil(S / 2)``: a batch is stretched only while it has been dispatched into the
  first half of the stages, so the newcomers' catch-up (§5.2.2) is at most half the model (§3.3's Case III merges
  after the first of four operators);
* ``max_allow_merge_ms`` -- the time a batch at the stretch limit size takes through those stages, ``sum_{s <
  max_allow_merge_stage} T_s(max_allow_merge_batchsize - 1)``: a batch still within its mergeable stages at
  full size is stretched, one held longer than that is not (the two limits agree);
* ``preferred_seq_len`` -- the table's profiled lengths (the shapes an engine is built and timed for);
* ``buffer_set_size`` -- ``[engine] buffer_pairs`` (default 2, §8.6: "two buffer pairs are already enough");
* Triton's window ``max_queue_delay_ms`` -- 0: §8.8 runs DVABatch with a zero window, Policy I "prefers a smaller
  batch time window" (§7.2), and later arrivals are batched by stretch;
* ``scheduler`` -- §8.1's assignment: BERT-base and BERT-large ``INPUT_DVA`` (input diversity), LinkNet and UNet
  ``OPERATOR_DVA`` (operator diversity), VGG19 and ResNet152 ``LOAD_DVA`` (load diversity only); another model by
  the table: a length dimension ``INPUT_DVA``, stages whose preferred sizes differ by 2x or more ``OPERATOR_DVA``,
  else ``LOAD_DVA``.

* Triton's instance count -- one: the paper states none, Triton's default without an ``instance_group`` is one
  instance per GPU (the DVABatch experiments use one Titan RTX), and each instance of the code has its own
  scheduler and batch table (lego.cc:656-666), so a stretch never crosses instances; ``[engine] instances`` other
  than 1 is refused.
"""

from __future__ import annotations

from typing import Any, ClassVar

from dvasim.core.arith import int_sum, left_sum
from dvasim.errors import ConfigError
from dvasim.policies.base import New, Split, Stretch, check_nonneg_number, check_positive_int, register
from dvasim.policies.dvabatch import operator_diversity, reference_length, service_lengths
from dvasim.policies.triton import TritonDynamicBatcher, note_payloads

SCHEDULERS = ("NORMAL", "NORMAL_INPUT", "LOAD_DVA", "INPUT_DVA", "OPERATOR_DVA")
TIME_UNITS = ("as-named", "as-coded")
# §8.1: "All models experience load diversity. Besides, BertBase and BertLarge show input diversity, LinkNet and
# Unet show operator diversity."
PAPER_SCHEDULERS = {"bert_base": "INPUT_DVA", "bert_large": "INPUT_DVA", "linknet": "OPERATOR_DVA",
                    "unet": "OPERATOR_DVA", "vgg19": "LOAD_DVA", "resnet152": "LOAD_DVA"}


def _int_list(field: str, value: Any) -> list[int] | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ConfigError(field, f"must be a list of integers >= 1, got {value!r}")
    return [check_positive_int(field, v) for v in value]


class DVABatchBuilt(TritonDynamicBatcher):
    """DVABatch as its authors' Triton backend runs it (github sjtu-epcc/DVABatch): Triton's dynamic batcher in
    front, a scheduler chosen by hand (NORMAL, NORMAL_INPUT, LOAD_DVA, INPUT_DVA, OPERATOR_DVA) with fixed stretch
    thresholds checked once at hand-off, bucket padding, and the one-stage split of OPERATOR_DVA.

    The rest of this docstring is the module's: see :mod:`dvasim.policies.dvabatch_built`."""

    name = "dvabatch-built"
    aliases = ("lego",)
    params = {
        "scheduler": "the backend's scheduler_type: NORMAL, NORMAL_INPUT, LOAD_DVA, INPUT_DVA or OPERATOR_DVA "
                     "(default: §8.1's for the six models, else identified from the table)",
        "max_batch_size": "Triton's max_batch_size (the payload's largest size; OPERATOR_DVA's stretch limit)",
        "max_queue_delay_ms": "Triton's max_queue_delay_microseconds / 1000 (default 0, §8.8)",
        "max_allow_merge_batchsize": "stretch only while bs + k < this (default: largest preferred batch size + 1)",
        "max_allow_merge_stage": "stretch only while the furthest stage dispatched into is below this "
                                 "(default: ceil(stages / 2))",
        "max_allow_merge_ms": "stretch only within this long of the batch's creation (default: the mergeable "
                              "stages' time at the stretch limit size)",
        "merge_time_units": '"as-named" (max_allow_merge_ms in ms, default) or "as-coded" (the code compares the '
                            '"microseconds" value with nanoseconds: 1000x shorter)',
        "favor_per_stage": "OPERATOR_DVA: each stage's favoured batch size (default: the table's preferred sizes)",
        "preferred_seq_len": "INPUT_DVA: the length buckets, ascending (default: the table's profiled lengths)",
    }
    default_delay_ms: ClassVar[float] = 0.0

    def __init__(self, scheduler=None, max_batch_size=64, max_queue_delay_ms=0.0, max_allow_merge_batchsize=None,
                 max_allow_merge_stage=None, max_allow_merge_ms=None, merge_time_units="as-named",
                 favor_per_stage=None, preferred_seq_len=None):
        super().__init__(max_batch_size, None, max_queue_delay_ms)
        if scheduler is not None and scheduler not in SCHEDULERS:
            raise ConfigError("policy.scheduler", f"must be one of {', '.join(SCHEDULERS)}, got {scheduler!r}")
        self._scheduler = scheduler
        self._merge_bs = None if max_allow_merge_batchsize is None else check_positive_int(
            "policy.max_allow_merge_batchsize", max_allow_merge_batchsize)
        self._merge_stage = None if max_allow_merge_stage is None else check_positive_int(
            "policy.max_allow_merge_stage", max_allow_merge_stage, minimum=0)
        self._merge_ms = None if max_allow_merge_ms is None else check_nonneg_number(
            "policy.max_allow_merge_ms", max_allow_merge_ms)
        if merge_time_units not in TIME_UNITS:
            raise ConfigError("policy.merge_time_units", f"must be one of {', '.join(TIME_UNITS)}, got "
                                                         f"{merge_time_units!r}")
        self.merge_time_units = merge_time_units
        self._favor = _int_list("policy.favor_per_stage", favor_per_stage)
        self._buckets = _int_list("policy.preferred_seq_len", preferred_seq_len)
        if self._buckets is not None and self._buckets != sorted(set(self._buckets)):
            raise ConfigError("policy.preferred_seq_len", f"must be strictly ascending, got {self._buckets!r}")
        self._no_split_at: set[int] = set()  # batches whose next boundary follows their split stage
        self._split_last = -1  # the last batch split (its merge disabled, lego_schedule.h:250-253)
        self._ops: list = []  # what the backend's Execute decided in the current front-door decision

    # ------------------------------------------------------------------ setup
    def bind(self, view) -> None:
        super().bind(view)
        prof = view.profile
        n = prof.n_stages
        if int(getattr(view, "instances", 1)) != 1:
            raise ConfigError("engine.instances", "dvabatch-built runs one model instance (each instance of the "
                                                  "authors' backend has its own scheduler); set engine.instances = 1")
        self.has_len = getattr(prof, "seq_lens", None) is not None
        ref = reference_length(prof, service_lengths(prof, view))
        preferred = [prof.preferred_batch_size(s, ref, 0.9) for s in range(n)]
        if self._scheduler is not None:
            self.scheduler = self._scheduler
        else:
            model = str(getattr(prof, "name", "") or "").split("_titanrtx")[0].split("@")[0]
            self.scheduler = next((v for k, v in PAPER_SCHEDULERS.items() if model.startswith(k)), None) or (
                "INPUT_DVA" if self.has_len else "OPERATOR_DVA" if operator_diversity(preferred) else "LOAD_DVA")
        if self.scheduler in ("INPUT_DVA", "NORMAL_INPUT") and not self.has_len:
            raise ConfigError("policy.scheduler", f"{self.scheduler} needs a latency table with a seq_len column")
        if self._favor is not None and len(self._favor) != n:
            raise ConfigError("policy.favor_per_stage", f"must give {n} sizes (one per stage), got {self._favor}")
        self.favor_per_stage = self._favor or preferred
        self.preferred_seq_len = self._buckets or (sorted(int(x) for x in prof.seq_lens) if self.has_len else None)
        self.buffer_set_size = int(getattr(view, "n_buffer_pairs", 2))
        self.max_allow_merge_batchsize = self._merge_bs if self._merge_bs is not None else min(
            max(preferred) + 1, self.max_batch_size + 1)
        self.max_allow_merge_stage = self._merge_stage if self._merge_stage is not None else -(-n // 2)
        if self._merge_ms is not None:
            self.max_allow_merge_ms = self._merge_ms
        else:
            b = max(1, min(self.max_allow_merge_batchsize - 1, prof.max_batch_size))
            self.max_allow_merge_ms = left_sum(prof.latency(s, b, ref) for s in range(min(self.max_allow_merge_stage, n)))
        self._window_ms = self.max_allow_merge_ms / (1000.0 if self.merge_time_units == "as-coded" else 1.0)
        b_ = self.buffer_set_size
        self.max_backend_batches = 1 if (b_ == 1 or self.scheduler == "OPERATOR_DVA") else (b_ - 1) * (n + 1) + 1

    def _bind_release(self, view) -> None:
        from dvasim.policies.triton_release import InstancePipeline, release_rules

        rules = release_rules(getattr(view, "triton_release", "ideal"), False)
        self._instances = InstancePipeline(rules, self, 1, backend_free=self._backend_free)

    def describe(self) -> dict:
        d = {"name": self.name, "max_batch_size": self.max_batch_size, "max_queue_delay_ms": self.max_queue_delay_ms,
             "merge_time_units": self.merge_time_units}
        if self.view is not None:
            d.update(scheduler=self.scheduler, triton_release=self.triton_release,
                     buffer_set_size=self.buffer_set_size, max_backend_batches=self.max_backend_batches)
            if self.scheduler in ("LOAD_DVA", "OPERATOR_DVA"):
                d.update(max_allow_merge_batchsize=self.merge_size_limit,
                         max_allow_merge_stage=self.max_allow_merge_stage,
                         max_allow_merge_ms=self.max_allow_merge_ms)
            if self.scheduler == "OPERATOR_DVA":
                d["favor_per_stage"] = list(self.favor_per_stage)
            if self.scheduler == "INPUT_DVA":
                d["preferred_seq_len"] = list(self.preferred_seq_len)
        return d

    # ------------------------------------------------------------------ the backend's Execute
    def _backend_free(self) -> bool:
        """The backend's thread has returned from its last Execute: fewer batches inside than its tokens allow."""
        return len(self.view.table) + int_sum(1 for op in self._ops if isinstance(op, New)) < self.max_backend_batches

    def admit(self, now: float):
        self._ops = []
        taken = []
        while True:
            p = self._instances.take(now)
            if p is None:
                break
            taken.append(p.queries)
            self._main_schedule(p.queries, now)
        note_payloads(self._instances, taken, now)  # the records' payload_ms and instance_ms
        ops, self._ops = self._ops, []
        return ops

    def _main_schedule(self, queries: list, now: float) -> None:
        """``MainSchedule`` on one Triton batch: new, stretch or buckets (see the module docstring)."""
        sched = self.scheduler
        if sched == "INPUT_DVA":
            for pad, group in self.buckets(queries):
                self._ops.append(New(group, pad_len=pad))
            return
        if sched in ("LOAD_DVA", "OPERATOR_DVA"):
            found = self._merge_target(len(queries), now)
            if found is not None:
                target, stage = found
                if isinstance(target, New):  # made in this decision, not started: the requests join it
                    target.queries = [*target.queries, *queries]
                else:  # the batch's rows go on alone through the stage they were dispatched into
                    merge = min(stage, self.view.profile.n_stages - 2)
                    self._ops.append(Stretch(target.bid, list(queries), merge_stage=merge if merge > 0 else None))
                return
        self._ops.append(New(list(queries)))

    @property
    def merge_size_limit(self) -> int:
        """The stretch's strict size limit: the model's ``max_batch_size`` under OPERATOR_DVA (lego.cc:708), else
        ``max_allow_merge_batchsize``."""
        return self.max_batch_size if self.scheduler == "OPERATOR_DVA" else self.max_allow_merge_batchsize

    def dispatch_position(self, index: int) -> int:
        """``handled_stages_`` of the batch ``index`` places behind the oldest one inside the backend: the furthest
        stage its stage threads have dispatched it into (S: every stage). A stage thread forwards a batch before it
        launches it (lego.cc:1134-1147) and takes a token of its boundary after each forward (lego.cc:1164-1172);
        a token comes back when the next stage dispatches, the last boundary's at GPU completion (lego.cc:1178,
        1202-1204). With instant host dispatch the batches inside fill the boundaries from the last: B batches
        dispatched into every stage, then B - 1 at each earlier boundary, (B - 1)(S + 1) + 1 in all."""
        n, b = self.view.profile.n_stages, self.buffer_set_size
        if index < b or b < 2:
            return n
        return max(0, n - -(-(index - b + 1) // (b - 1)))

    def _merge_target(self, k: int, now: float):
        """The latest batch if the Triton batch of ``k`` requests may stretch it (all three strict conditions), and
        the stage it has been dispatched into (the merge stage); else None."""
        limit = self.merge_size_limit
        table = self.view.table
        news = [op for op in self._ops if isinstance(op, New)]
        inside = len(table) + len(news)
        if news:  # the latest batch is one made in this decision (created now, not started)
            latest, size, created = news[-1], len(news[-1].queries), now
        else:
            latest = table.latest()
            if latest is None or table.can_stretch(latest.bid) is not None or latest.bid == self._split_last:
                return None
            size = latest.bs + int_sum(len(op.queries) for op in self._ops if isinstance(op, Stretch))
            created = latest.created
        if not size + k < limit:
            return None
        stage = self.dispatch_position(inside - 1)
        if not stage < self.max_allow_merge_stage:
            return None
        if not now - created < self._window_ms:
            return None
        return latest, stage

    def buckets(self, queries: list) -> list[tuple[int, list]]:
        """INPUT_DVA's buckets, ascending: each request goes to the first boundary at or above its length (one
        above every boundary to its own length: the code's 0 is a defect)."""
        out: dict[int, list] = {}
        bounds = self.preferred_seq_len
        for q in queries:
            pad = next((b for b in bounds if q.seq_len <= b), q.seq_len)
            out.setdefault(pad, []).append(q)
        return sorted(out.items())

    # ------------------------------------------------------------------ OPERATOR_DVA's split
    def at_boundary(self, batch, stage: int, now: float):
        if self.scheduler != "OPERATOR_DVA":
            return None
        if batch.bid in self._no_split_at:
            self._no_split_at.discard(batch.bid)  # (the fixed defect: no second split right after a split)
            return None
        nxt = stage + 1
        n = batch.bs
        if nxt >= batch.n_stages - 1 or batch.issued[nxt] != 0:  # s + 1 < S - 1, i.e. s < S - 2
            return None
        f = self.favor_per_stage[nxt]
        if n < 4 * f:
            return None
        self._no_split_at.add(batch.bid)
        self._split_last = batch.bid
        return Split(batch.bid, [2 * f, n - 2 * f], "one-stage")


register(DVABatchBuilt)
