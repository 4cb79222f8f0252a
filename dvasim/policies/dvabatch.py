"""DVABatch's scheduling policies (paper §7) on top of the meta operations.

**Identifying the diversities (§7.1).** ``dvabatch`` picks the policies the service's diversities call for, as
the paper identifies them offline, from the latency table and the service's input lengths:

* *input* -- the table has a sequence-length dimension and the service's lengths make padding costly: a full
  batch (``bs_max`` queries drawn from the length distribution) padded to its longest query takes at least
  ``input_threshold`` (10%) longer than the same queries would at their own lengths (expected times from the
  table, the longest of ``bs_max`` draws from the order statistics of the empirical distribution). Where the
  engine does not know the lengths (no workload), a table with lengths is taken to mean input diversity.
* *operator* -- an earlier stage prefers a batch at least twice as large as a later stage does
  (:func:`operator_diversity`: §3.2's UNet, whose first operators benefit from large batches and last ones from
  small, Figure 6; Policy II splits a batch for the *remaining* stages, Figure 13, and by halves, so a smaller
  difference gives it nothing to do). Stages that prefer larger batches further on (ResNet's and VGG's widening
  blocks: preferred sizes [2, 4, 4, 8] and [1, 1, 2, 21] on the Titan RTX tables) are not operator diversity:
  §8.1 gives ResNet152 and VGG19 load diversity only. (Until issue 33 the rule was "the largest preferred size at
  least twice the smallest", which named ResNet152, VGG19 and BERT-base operator-diverse against §8.1.) A stage's
  preferred batch size is the smallest profiled one whose throughput reaches ``preferred_threshold`` (90%) of the
  stage's best, at the median input length (the table's longest length when the lengths are unknown). The Titan
  RTX UNet table gives no stage a batching gain beyond batch 2 (every preferred size 1), so no operator diversity
  is identified there, against §8.1 (the README's policy-identification table shows why).
* *load* -- always (§7.1: "all the models are considered to have load diversities"), except together with
  *input*: new batches entering the pipeline independently already resolve load diversity (§7.2).

``policies = [...]`` overrides the choice (an empty list leaves multi-entry pipelining alone: every batch enters
the pipeline as soon as the first stage takes it, never stretched, split or clustered).

**Policy I, input diversity.** Pending queries are clustered by length (sorted by length, cut where the summed
latency of the clusters running side by side is smallest; at most ``max_clusters``; on a stack whose host does
part of a batch's launching one batch at a time, under an interpreter lock, each cluster's latency also counts
that serial host work of its own and of the clusters launched before it, :func:`serial_host_cost`: ours, since
issue 33, so that clustering never pays more host time than it saves device time); each cluster is padded to
its own longest input and enters the pipeline as a batch of its own, so the clusters run in parallel. At most
``bs_max`` queries are active in the pipeline. A batch leaves the front door when the first stage is free, when
``bs_max`` queries (or the room left) are pending, or when the oldest has waited the batch window: the first
stage's time at ``bs_max`` for the longest *pending* input (§7.2), never more than the QoS target. So the window
binds only while the first stage is busy (ours: the paper does not say what happens when it is free; sending at
once there is Triton's behaviour with an idle instance).

**Policy II, operator diversity.** When a splittable batch of size ``bs`` has completed a stage, it is split in
two when the remaining stages take ``T_remain(bs) >= split_factor * T_remain(bs/2)`` (``split_factor`` = 2 in
the paper), and the halves are examined again. The test runs at every batch size: a batch is created
*splittable* when it would pass it at some later boundary at its size (then never stretched, §5.2.2), and a
stretched batch is re-examined at its new size (then it becomes splittable and its stretching ends), so one batch
can be *new*, then *stretched*, then *split* (Figure 8). Sub-batches run one after another (``split_manner =
"serial"``, §7.2: "the two smaller batches run in the serial manner") or overlapping (``"pipelined"``).

**Policy III, load diversity.** Newly arrived queries *stretch* the latest batch (the most recently made) unless it
may be split (§5.2.2), has been handed to the last stage, is already sufficient, or its T_comp_wait is spent;
otherwise they wait for the first stage to take a new batch. The conditions, each marked with whose it is:

* *Up to a sufficient batch.* The paper's Case III (§3.3): the first query "starts to run alone ..., and the GPU
  is not fully utilized"; "the two insufficient batches are merged into a new batch that fully utilizes the
  hardware". Ours: the paper gives no size, so a batch is stretched only up to the batch size that fully
  utilizes the stages the merged batch will run together -- the largest preferred batch size among the stages
  after the merge boundary (all stages for a batch not yet started) -- and never beyond ``bs_max``. Where one
  query already fully utilizes those stages (every preferred batch size 1: the UNet table here) nothing is
  stretched, as merging would save no device time and only make the first queries wait.
* *T_comp_wait and a stage limit: the default (``t_comp_wait_rule = "derived"``), as the authors built it.*
  The paper (§7.2): "We set a time threshold T_comp_wait to eliminate the possible QoS violation. If a batch is
  already processed for T_comp_wait, no stretch operation is allowed on this batch." It gives no value; the
  authors' backend (:mod:`dvasim.policies.dvabatch_built`) checks fixed thresholds, a time since the batch was made
  and the furthest stage it was dispatched into (lego_schedule.h:633-636), and no QoS rule at all. Derived here
  from the table, never fitted: ``max_stretch_stage = ceil(S / 2)`` (a batch is stretched only while it has been
  handed to the first half of the stages, so the newcomers' catch-up is at most half the model; §3.3's Case III
  merges after the first of four operators) and ``t_comp_wait_ms = sum_{s < max_stretch_stage} T_s(cap)``, the
  time those stages take at the stretch cap (the largest preferred batch size, at most ``bs_max``): a batch
  processed longer than a sufficient batch takes to clear its mergeable stages is not stretched. The two limits
  agree, and both are reported by ``describe()``. ``experiments/tcomp_wait_sweep.py`` sweeps them.
* *T_comp_wait from the QoS target* (``t_comp_wait_rule = "qos"``; the default before issue 33). The paper: "a
  latter batch should be able to join a previous batch, if it does not result in the QoS violation of the
  previous batch". Ours derives it, per batch, from the QoS target ``Q`` (the run's
  ``[qos] target_ms``, or ``qos_target_ms``) and the latency table: the stretch of a batch of ``b`` queries, the
  oldest of which arrived at ``a``, by ``k`` newcomers at time ``now`` is made iff ``F - a <= Q``, where

      F = now + W + sum_{s <= f} T_s(k) + sum_{s > f} T_s(b + k)

  is when the merged batch would leave the last stage: ``f`` is the merge boundary (the furthest stage any of
  the batch's queries has been handed to; the newcomers catch up through stages ``0..f`` and the batch continues
  merged from ``f + 1``, §5.2.2), ``T_s(n)`` the table's standalone time of stage ``s`` at batch size ``n``
  (padded to the longest input of the rows it runs; the merged stages to the merged batch's longest), and ``W``
  the work the batch's own queries still have up to ``f``: the rest of its running executions (the time since
  the first of them started, less what the batch's executions finished since then took, is counted as done),
  then its rows handed to a stage but not started and those still catching up (earlier newcomers), each at its
  own size; rows not yet handed to a stage go on together with the newcomers, and newcomers join a catch-up
  item still waiting in the first stage's queue, as the pipeline does. A batch not yet started runs merged from
  the first stage: ``F = now + sum_s T_s(b + k)``. Equivalently ``T_comp_wait = Q - (F - now)``, measured from
  the oldest query's arrival: no stretch once ``now - a > T_comp_wait``. ``F`` adds the times as if run one
  after another, so it is exact on one instance of the exclusive (sequential) device for a batch alone in the
  pipeline, and an upper bound for such a batch when executions overlap (fluid, parallel, cores); a serial
  split of the merged batch later does not delay its last query (Policy II splits only where ``T_remain(bs) >=
  2 T_remain(bs/2)``, up to the rounding of an odd size). What ``F`` ignores (ours, not the paper's): the
  device time that other batches in flight take from the batch (older ones further down the pipeline, new ones
  entering later), a busy executor's queue, launch and host costs, and jitter. So on a loaded pipeline a
  stretched batch can still miss its target; the rule only makes sure the stretch itself, on the table's
  times, does not take it there. The rule needs a QoS target.

  Figure 3 Case III and Figure 8 (T = 1 ms) stretch as the paper shows under the study's 200 ms target (§8.1):
  their merged batches leave 9T and 11T after their oldest query; Case III stretches for any target of 9T or
  more, and its query 1 then leaves at 9T instead of 8T. Overrides: ``t_comp_wait_ms`` is a fixed T_comp_wait
  (no stretch of a batch whose first stage started on it longer ago), and ``t_comp_wait_frac`` the same as a
  fraction of the model's batch-1 latency (0.25, the smallest fraction that reproduces Case III, was the default
  before; the two are exclusive). ``describe()`` reports ``t_comp_wait_rule`` and ``t_comp_wait_ms`` (for the QoS
  rule its bound, the QoS target itself; ``None`` without a target). ``experiments/README.md`` measures the rule
  against fixed fractions: in this simulator stretching a started batch costs latency on average.

**No diversity for the pipeline to serve.** Where one query already fully utilizes every stage (every preferred
batch size is 1) and there is no input diversity, batches side by side in the pipeline only share a saturated
device -- each slows the others, and no throughput is gained -- and Policy III has nothing to merge. With the
policies identified (``policies`` not given) and ``pipeline`` not set, DVABatch then runs one batch at a time
(as ``pipeline = false``: §7.2's serial manner "as the hardware is already fully utilized", applied to the front
door, ours), and so performs as the traditional policy (§9.3: "It performs the same as the traditional batch
policy for the models without any diversity"); ``describe()`` then reports ``pipeline: false``.

**Reorchestrating strategies (the characterization study's Table 5).** Stretch, split and pipelined execution are
mutually independent, so a *strategy* is which of the three are on, given by three optional flags (``None``, the
default, leaves everything as above):

* ``stretch``: ``False`` turns Policy III's stretching off, ``True`` on (even where §7.1 would not pick *load*);
* ``split``: ``False`` turns Policy II's splitting off, ``True`` on (even where §7.1 would not pick *operator*;
  a batch is still split only where the ``split_factor`` test passes);
* ``pipeline``: ``False`` means no pipelined execution: a new batch enters the first stage only when an instance
  holds no batch at all (``free_instances() > 0``, Triton's gate), so batches never overlap across stages (one at a
  time with one instance); stretch and split still act within that one batch (its split sub-batches are its own).
  With Policy I the pending queries then form a single batch (no clustering). ``True``: multi-entry pipelining
  (a new batch enters as soon as the first stage is free); ``None``: the same, except where one query already
  fully utilizes every stage (above).

The eight strategies, in Table 5's order (Stretch, Split, Pipeline as bits): I = 000 (naive batching), II = 001,
III = 010, IV = 011, V = 100, VI = 101, VII = 110, VIII = 111 (everything on). ``experiments/table5_strategies.py``
runs them with ``policies = []`` so that only the three flags matter.

``dvabatch-split`` enables only *split* (the paper's Figure 18), behind a Triton-style window.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, ClassVar

from dvasim.core.arith import int_sum, left_sum
from dvasim.core.compiling import mypyc_attr
from dvasim.errors import ConfigError
from dvasim.policies.base import (
    SPLIT_MANNERS,
    FrontDoorPolicy,
    New,
    Split,
    Stretch,
    check_nonneg_number,
    check_positive_int,
    register,
    time_eps,
)

KINDS = ("input", "operator", "load")
EPS = 1e-9
RULES = {  # Policy III's T_comp_wait, as describe() reports it
    "derived": "derived: no stretch of a batch processed longer than t_comp_wait_ms (its mergeable stages' time at "
               "the stretch cap) or handed to stage max_stretch_stage or beyond (the authors' fixed thresholds)",
    "qos": "qos: stretch iff (merged batch's finish - its oldest query's arrival) <= qos_target_ms",
    "fixed": "fixed: no stretch of a batch processed longer than t_comp_wait_ms",
    "frac": "frac: no stretch of a batch processed longer than t_comp_wait_frac x the batch-1 latency",
    "none": "none: every stretch allowed",
}


def service_lengths(prof, view) -> list[int] | None:
    """The service's input lengths as the pipeline knows them (``view.input_lengths``), or None: a table without
    lengths, or lengths unknown."""
    if getattr(prof, "seq_lens", None) is None:
        return None
    lengths = getattr(view, "input_lengths", None)
    return None if lengths is None or len(lengths) == 0 else [int(x) for x in lengths]


def reference_length(prof, lengths: list[int] | None) -> int | None:
    """The length a stage's preferred batch size is read at: the median input length, the table's longest where
    the lengths are unknown, None for a table without lengths."""
    if getattr(prof, "seq_lens", None) is None:
        return None
    return int(sorted(lengths)[len(lengths) // 2]) if lengths else int(max(prof.seq_lens))


def operator_diversity(preferred: list[int]) -> bool:
    """Operator diversity (§3.2, Figure 6; §7.1): an earlier stage prefers a batch at least twice as large as a
    later stage does, so a batch formed for the early stages is worth splitting for the later ones (Policy II
    splits for the *remaining* stages, Figure 13). Stages that prefer larger batches further on (ResNet's and
    VGG's widening blocks) give Policy II nothing to split: §8.1 gives them load diversity only."""
    best_before = 0
    for p in preferred:
        if best_before >= 2 * p:
            return True
        best_before = max(best_before, p)
    return False


def _length_hist(lengths) -> tuple[list[tuple[int, int]], int]:
    hist = sorted(Counter([int(x) for x in lengths]).items())
    return hist, int_sum([c for _, c in hist])


def padded_batch_ms(profile, lengths, batch_size: int) -> float:
    """Expected whole-model time of a batch of ``batch_size`` lengths drawn from ``lengths`` (an empirical
    distribution), padded to its longest: ``E[total(b, max of b L)]``, from the order statistics."""
    hist, n = _length_hist(lengths)
    padded, cdf_prev, cum = 0.0, 0.0, 0
    for v, c in hist:
        cum += c
        cdf = cum / n
        padded += (cdf ** batch_size - cdf_prev ** batch_size) * profile.total(batch_size, v)
        cdf_prev = cdf
    return padded


def padding_waste(profile, lengths, batch_size: int) -> float:
    """Expected share of a padded batch's time lost to padding: ``1 - E[total(b, L)] / E[total(b, max of b L)]``
    for ``b = batch_size`` lengths drawn from ``lengths`` (an empirical distribution)."""
    hist, n = _length_hist(lengths)
    if not n:
        return 0.0
    own = left_sum([c * profile.total(batch_size, v) for v, c in hist]) / n
    padded = padded_batch_ms(profile, lengths, batch_size)
    return 1.0 - own / padded if padded > 0 else 0.0


@mypyc_attr(allow_interpreted_subclasses=True)
class DVABatch(FrontDoorPolicy):
    """DVABatch (Cui et al., ATC'22, §7): multi-entry multi-exit batching on a sliced model. Policy I (input
    diversity) clusters pending queries by length, Policy II (operator diversity) splits a batch where its
    remaining stages prefer smaller batches, Policy III (load diversity) stretches the latest batch with new
    queries; which apply is identified from the table unless ``policies`` says; ``stretch``, ``split`` and
    ``pipeline`` switch the mechanisms on or off one by one (the characterization study's Table 5 strategies).

    The rest of this docstring is the mechanism's: see the module docstring."""

    name = "dvabatch"
    # Policy I's serial host work of a cluster, (rows, length) -> ms, or None (dvasim.policies.dvabatch.serial_host_cost)
    _host_serial: Any
    params = {
        "max_batch_size": "bs_max: the largest batch, and the most queries active in the pipeline (Policy I)",
        "policies": 'which diversities to handle: a list of "input", "operator", "load" (default: identified from '
                    "the table and the input lengths; [] = multi-entry pipelining only)",
        "max_queue_delay_ms": "front-door batch window (default: Policy I's first-stage time at bs_max for the "
                              "longest pending input, at most the QoS target; else 0)",
        "t_comp_wait_ms": "Policy III: a fixed T_comp_wait, a batch processed longer than this is no longer "
                          "stretched (default: the time the stages below max_stretch_stage take at the stretch cap, "
                          "the largest preferred batch size)",
        "t_comp_wait_rule": 'Policy III: "derived" (default: a fixed T_comp_wait and a stage limit, derived as the '
                            'authors\' backend thresholds are) or "qos" (stretch only if the merged batch still meets '
                            'qos_target_ms on the table\'s times) or "none" (every stretch allowed, for studies)',
        "cluster_host_cost": "Policy I: count the serving stack's serial host work in the clusters' cost (default true; "
                             "false: the GPU's time alone, as before issue 33 and as a replay's policy, which knows "
                             "no stack, decides)",
        "max_stretch_stage": "Policy III: no stretch of a batch handed to this stage or a later one (default with the "
                             "derived rule: ceil(stages / 2); otherwise none)",
        "t_comp_wait_frac": "Policy III: T_comp_wait as this fraction of the model's batch-1 latency instead (a fixed "
                            "threshold; default: not used, the QoS rule)",
        "split_factor": "Policy II: split when T_remain(bs) >= split_factor * T_remain(bs/2) (default 2)",
        "split_manner": 'Policy II: "serial" (sub-batches one after another, default) or "pipelined"',
        "max_clusters": "Policy I: most length clusters formed from one batch of queries (default 3)",
        "input_threshold": "input diversity when padding wastes at least this share of a full batch (default 0.1)",
        "preferred_threshold": "preferred batch size: throughput at least this share of the best (default 0.9)",
        "qos_target_ms": "cap of Policy I's window and Policy III's QoS target (default: the run's [qos] "
                         "target_ms)",
        "stretch": "Policy III's stretching on (true) or off (false), whatever the diversities (default: on with "
                   '"load" in policies)',
        "split": "Policy II's splitting on (true) or off (false), whatever the diversities (default: on with "
                 '"operator" in policies)',
        "pipeline": "pipelined execution: false = a new batch enters only when an instance holds no batch, so "
                    "batches never overlap across stages (default: multi-entry pipelining, except one batch at a "
                    "time where one query already fully utilizes every stage and the policies are identified)",
    }
    default_policies: ClassVar[tuple[str, ...] | None] = None  # None: decide from the table

    def __init__(self, max_batch_size=64, policies=None, max_queue_delay_ms=None, t_comp_wait_ms=None,
                 t_comp_wait_frac=None, split_factor=2.0, split_manner="serial", max_clusters=3,
                 input_threshold=0.1, preferred_threshold=0.9, qos_target_ms=None, stretch=None, split=None,
                 pipeline=None, t_comp_wait_rule=None, max_stretch_stage=None, cluster_host_cost=True):
        super().__init__()
        if not isinstance(cluster_host_cost, bool):
            raise ConfigError("policy.cluster_host_cost", f"must be true or false, got {cluster_host_cost!r}")
        self.cluster_host_cost = cluster_host_cost
        if t_comp_wait_rule is not None and t_comp_wait_rule not in ("derived", "qos", "none"):
            raise ConfigError("policy.t_comp_wait_rule", f'must be "derived", "qos" or "none", got '
                                                         f"{t_comp_wait_rule!r}")
        if t_comp_wait_rule is not None and (t_comp_wait_ms is not None or t_comp_wait_frac is not None):
            raise ConfigError("policy.t_comp_wait_rule", "give a rule or a fixed T_comp_wait (t_comp_wait_ms or "
                                                         "t_comp_wait_frac), not both")
        self._rule = t_comp_wait_rule
        self._max_stretch_stage = None if max_stretch_stage is None else check_positive_int(
            "policy.max_stretch_stage", max_stretch_stage, minimum=0)
        self.max_batch_size = check_positive_int("policy.max_batch_size", max_batch_size)
        if policies is None:
            policies = self.default_policies
        if policies is not None:
            if isinstance(policies, str):
                policies = [policies]
            if not isinstance(policies, (list, tuple)) or not all(p in KINDS for p in policies):
                raise ConfigError("policy.policies", f"must be a list of {', '.join(KINDS)}; got {policies!r}")
            policies = tuple(dict.fromkeys(policies))
        self._asked = policies
        self._window = None if max_queue_delay_ms is None else check_nonneg_number(
            "policy.max_queue_delay_ms", max_queue_delay_ms)
        self._t_comp_wait = None if t_comp_wait_ms is None else check_nonneg_number(
            "policy.t_comp_wait_ms", t_comp_wait_ms)
        self.t_comp_wait_frac = None if t_comp_wait_frac is None else check_nonneg_number(
            "policy.t_comp_wait_frac", t_comp_wait_frac)
        if self._t_comp_wait is not None and self.t_comp_wait_frac is not None:
            raise ConfigError("policy.t_comp_wait_frac", "give policy.t_comp_wait_ms (a fixed T_comp_wait) or "
                                                         "policy.t_comp_wait_frac (a fraction of the batch-1 "
                                                         "latency), not both")
        sf = check_nonneg_number("policy.split_factor", split_factor)
        if sf < 1.0:
            raise ConfigError("policy.split_factor", f"must be >= 1, got {split_factor!r}")
        self.split_factor = sf
        if split_manner not in SPLIT_MANNERS:
            raise ConfigError("policy.split_manner", f"must be one of {', '.join(SPLIT_MANNERS)}; got {split_manner!r}")
        self.split_manner = split_manner
        self.max_clusters = check_positive_int("policy.max_clusters", max_clusters)
        self.input_threshold = check_nonneg_number("policy.input_threshold", input_threshold)
        pt = check_nonneg_number("policy.preferred_threshold", preferred_threshold)
        if not 0 < pt <= 1:
            raise ConfigError("policy.preferred_threshold", f"must be in (0, 1], got {preferred_threshold!r}")
        self.preferred_threshold = pt
        self._qos = None if qos_target_ms is None else check_nonneg_number("policy.qos_target_ms", qos_target_ms)
        for field, value in (("stretch", stretch), ("split", split), ("pipeline", pipeline)):
            if value is not None and not isinstance(value, bool):
                raise ConfigError(f"policy.{field}", f"must be true or false, got {value!r}")
        self._stretch_flag, self._split_flag, self._pipeline_flag = stretch, split, pipeline
        self.pipeline = pipeline is not False

    # ------------------------------------------------------------------ setup (§7.1)
    def bind(self, view) -> None:
        super().bind(view)
        prof = view.profile
        self._jobs: dict[tuple[int, int], tuple[float, float]] = {}  # _cluster_job's, by (size, length)
        self._hosts: dict[tuple[int, int], float] = {}  # _cluster_host's, by (size, length)
        self._host_serial = (serial_host_cost(getattr(view, "served", None), prof.n_stages) if self.cluster_host_cost
                             else None)
        if self.max_batch_size > prof.max_batch_size:
            raise ConfigError("policy.max_batch_size",
                              f"{self.max_batch_size} exceeds the table's largest profiled batch size {prof.max_batch_size}")
        self.has_len = getattr(prof, "seq_lens", None) is not None
        lengths = service_lengths(prof, view)
        self.ref_len: int | None = reference_length(prof, lengths)  # (None: a table without lengths)
        self.qos_target_ms = self._qos if self._qos is not None else getattr(view, "qos_target_ms", None)
        self.preferred = [prof.preferred_batch_size(s, self.ref_len, self.preferred_threshold)
                          for s in range(prof.n_stages)]
        self.padding_waste = padding_waste(prof, lengths, self.max_batch_size) if lengths else math.nan
        if self._asked is not None:
            self.policies = self._asked
            if "input" in self.policies and not self.has_len:
                raise ConfigError("policy.policies", '"input" needs a latency table with a seq_len column')
        else:
            chosen = []
            if self.has_len and (lengths is None or self.padding_waste >= self.input_threshold):
                chosen.append("input")
            if operator_diversity(self.preferred):
                chosen.append("operator")
            if "input" not in chosen:
                chosen.append("load")
            self.policies = tuple(chosen)
        self.use_input = "input" in self.policies
        self.use_split = "operator" in self.policies if self._split_flag is None else self._split_flag
        self.use_stretch = "load" in self.policies if self._stretch_flag is None else self._stretch_flag
        self.max_queue_delay_ms = self._window  # None: Policy I's window, from the pending inputs
        # one query fully utilizes every stage and no input diversity: parallel batches would only share a saturated
        # device, so with the policies identified (not given) batches run one at a time (§7.2's serial manner)
        self.saturated = max(self.preferred) == 1 and not self.use_input
        self.serial_front = self._pipeline_flag is None and self._asked is None and self.saturated
        self.pipeline = self._pipeline_flag is not False and not self.serial_front
        n_st = prof.n_stages
        self.max_stretch_stage = self._max_stretch_stage
        if self._t_comp_wait is not None:
            self.t_comp_wait_rule, self.t_comp_wait_ms = "fixed", self._t_comp_wait
        elif self.t_comp_wait_frac is not None:
            self.t_comp_wait_rule = "frac"
            self.t_comp_wait_ms = self.t_comp_wait_frac * prof.total(1, self.ref_len)
        elif self._rule == "none":
            self.t_comp_wait_rule, self.t_comp_wait_ms = "none", None
        elif self._rule == "qos":
            if self.qos_target_ms is None:
                raise ConfigError("policy.t_comp_wait_rule", '"qos" needs a QoS target ([qos] target_ms or '
                                                             "policy.qos_target_ms)")
            # per batch: QoS - the time the merged batch still needs, from its oldest query's arrival; bounded by
            # the QoS target itself (a batch whose oldest query has waited that long is never stretched)
            self.t_comp_wait_rule, self.t_comp_wait_ms = "qos", self.qos_target_ms
        else:
            # the authors' fixed thresholds, derived (see the module docstring): a stage limit of half the stages,
            # and the time those stages take at the stretch cap
            if self.max_stretch_stage is None:
                self.max_stretch_stage = -(-n_st // 2)
            cap = min(self.max_batch_size, max(self.preferred))
            self.t_comp_wait_rule = "derived"
            self.t_comp_wait_ms = left_sum([prof.latency(s_, cap, self.ref_len)
                                            for s_ in range(min(self.max_stretch_stage, n_st))])

    def describe(self) -> dict:
        d = {"name": self.name, "max_batch_size": self.max_batch_size, "split_factor": self.split_factor,
             "split_manner": self.split_manner, "max_clusters": self.max_clusters}
        for field, value in (("stretch", self._stretch_flag), ("split", self._split_flag),
                             ("pipeline", self._pipeline_flag)):
            if value is not None:  # only when given: the defaults' resolved configs stay as they were
                d[field] = value
        if self.view is not None and self.serial_front:
            d["pipeline"] = False  # identified: one query fully utilizes every stage (see the module docstring)
        if self.view is not None:
            d.update(policies=list(self.policies), t_comp_wait_rule=RULES[self.t_comp_wait_rule],
                     t_comp_wait_ms=self.t_comp_wait_ms, preferred_batch_sizes=self.preferred)
            if self.max_stretch_stage is not None:
                d["max_stretch_stage"] = self.max_stretch_stage
            if self.use_input:
                d["cluster_host_cost"] = self.cluster_host_cost and self._host_serial is not None
            if self.t_comp_wait_frac is not None:
                d["t_comp_wait_frac"] = self.t_comp_wait_frac
            if self.max_queue_delay_ms is not None:
                d["max_queue_delay_ms"] = self.max_queue_delay_ms
            elif self.use_input:
                d["max_queue_delay_ms"] = "policy I: first stage at bs_max for the longest pending input"
            else:
                d["max_queue_delay_ms"] = 0.0
            if not math.isnan(self.padding_waste):
                d["padding_waste"] = round(self.padding_waste, 4)
        return d

    def window(self) -> float:
        """The front door's batch window now (ms)."""
        if self.max_queue_delay_ms is not None:
            return self.max_queue_delay_ms
        if not self.use_input or not self.pending:
            return 0.0
        longest = max(q.seq_len for q in self.pending)
        w = self.view.profile.latency(0, self.max_batch_size, longest)
        return min(w, self.qos_target_ms) if self.qos_target_ms else w

    # ------------------------------------------------------------------ Policy II
    def _would_split(self, stage_done: int, bs: int, seq_len) -> bool:
        """Would Policy II split a batch of ``bs`` at some boundary after ``stage_done`` (or a later stage)?"""
        if bs < 2:
            return False
        prof = self.view.profile
        for s in range(stage_done + 1, prof.n_stages):
            if prof.remaining(s, bs, seq_len) >= self.split_factor * prof.remaining(s, bs // 2, seq_len) - EPS:
                return True
        return False

    def split_sizes(self, bs: int, from_stage: int, seq_len) -> list[int]:
        """Recursive halving while ``T_remain(bs) >= split_factor * T_remain(bs/2)`` for stages ``from_stage..``."""
        prof = self.view.profile
        if bs < 2 or from_stage >= prof.n_stages:
            return [bs]
        half = bs // 2
        if prof.remaining(from_stage, bs, seq_len) >= self.split_factor * prof.remaining(from_stage, half, seq_len) - EPS:
            return self.split_sizes(bs - half, from_stage, seq_len) + self.split_sizes(half, from_stage, seq_len)
        return [bs]

    def at_boundary(self, batch, stage: int, now: float):
        if not (self.use_split and batch.splittable) or self.view.table.can_split(batch.bid, stage) is not None:
            return None  # (a stretched batch's newcomers still catching up: it is whole only further on)
        seq_len = max(q.seq_len for q in batch.queries) if self.has_len else None
        sizes = self.split_sizes(batch.bs, stage + 1, seq_len)
        return Split(batch.bid, sizes, self.split_manner) if len(sizes) > 1 else None

    # ------------------------------------------------------------------ Policy I
    def clusters(self, queries: list) -> list[list]:
        """Split queries (any order) into at most ``max_clusters`` groups of similar length, minimising the
        summed query latency of the groups when they run side by side on the device (the fluid sharing model,
        with each group's mean demand over the stages)."""
        qs = sorted(queries, key=lambda q: (q.seq_len, q.qid))
        n = len(qs)
        if n <= 1 or self.max_clusters == 1:
            return [qs]
        lens = [q.seq_len for q in qs]
        # candidate cut positions: where the length changes
        cuts = [k for k in range(1, n) if lens[k] != lens[k - 1]]
        job = self._cluster_job
        best_cost = math.inf
        best: tuple[tuple[int, int], ...] = ((0, n),)
        # every way to cut, depth first (a way, then the ways that cut its last group again, the earlier cut
        # first): the first of equal costs wins; a way is the groups' (start, end) positions in qs
        todo: list[tuple[int, int, tuple]] = [(0, 0, ())]
        while todo:
            start, k, acc = todo.pop()
            parts: tuple[tuple[int, int], ...] = (*acc, (start, n))  # the last group closed here
            finish = fluid_finish_times([job(e - s, lens[e - 1]) for s, e in parts])
            if self._host_serial is not None:  # each group's serial host work delays it and the groups after it
                behind = 0.0
                for i, (s_, e_) in enumerate(parts):
                    behind += self._cluster_host(e_ - s_, lens[e_ - 1])
                    finish[i] += behind
            c = left_sum([(e - s) * t for (s, e), t in zip(parts, finish)])
            if c < best_cost - EPS:
                best_cost, best = c, parts
            if k + 1 < self.max_clusters:
                todo.extend((cut, k + 1, (*acc, (start, cut))) for cut in reversed(cuts) if cut > start)
        return [qs[s:e] for s, e in best]

    def _cluster_host(self, size: int, seq_len: int) -> float:
        """The serial host work of a batch of ``size`` padded to ``seq_len`` (kept: the stack does not change)."""
        key = (size, seq_len)
        got = self._hosts.get(key)
        if got is None:
            got = self._hosts[key] = self._host_serial(size, seq_len)
        return got

    def _cluster_job(self, size: int, seq_len: int) -> tuple[float, float]:
        """A cluster of ``size`` queries padded to ``seq_len`` as a job of the fluid model: its standalone time
        through every stage and its mean demand over the stages (kept: the table does not change)."""
        key = (size, seq_len)
        got = self._jobs.get(key)
        if got is None:
            prof = self.view.profile
            got = self._jobs[key] = (prof.total(size, seq_len), _mean_demand(prof, size, seq_len))
        return got

    # ------------------------------------------------------------------ front door
    def _room(self) -> int:
        if self.use_input:
            return self.max_batch_size - self.view.active_queries()
        return self.max_batch_size

    def _first_stage_free(self) -> bool:
        return self.view.stage_idle(0)

    def admit(self, now: float):
        ops: list[New | Stretch] = []
        if not self.pending:
            return ops
        if self.use_stretch:
            stretch = self._stretch(now)
            if stretch is not None:
                ops.append(stretch)
                if not self.pending:
                    return ops
        room = self._room()
        if room <= 0:
            return ops
        n = len(self.pending)
        full = n >= min(room, self.max_batch_size)
        if not self.pipeline:
            # no pipelined execution: a new batch only into an instance that holds no batch (then at once with
            # Policy I, as Triton with an idle instance; else after the window or with a full batch)
            free = self.view.free_instances() > 0
            go = free and (self.use_input or full or now - self.pending[0].seen >= self.window() - time_eps(now))
            if not go:
                return ops
            batch = self.take(min(n, room, self.max_batch_size))
            seq_len = max(q.seq_len for q in batch) if self.has_len else None
            ops.append(New(batch, splittable=self.use_split and self._would_split(0, len(batch), seq_len)))
            return ops
        free = self._first_stage_free()
        # Policy I: batches enter independently; the window only bounds the wait while the first stage is busy.
        # Otherwise a new batch waits for a free first stage (and, with a window, for the window or a full batch).
        if self.use_input:
            go = free or full or now - self.pending[0].seen >= self.window() - time_eps(now)
        else:
            go = free and (full or now - self.pending[0].seen >= self.window() - time_eps(now))
        if not go:
            return ops
        batch = self.take(min(n, room, self.max_batch_size))
        groups = self.clusters(batch) if self.use_input else [batch]
        for g in groups:
            seq_len = max(q.seq_len for q in g) if self.has_len else None
            splittable = self.use_split and self._would_split(0, len(g), seq_len)
            ops.append(New(g, splittable=splittable))
        return ops

    def _stretch(self, now) -> Stretch | None:
        """Policy III: stretch the latest batch with pending queries, if it may be stretched."""
        table = self.view.table
        latest = table.latest()
        if latest is None or table.can_stretch(latest.bid) is not None:
            return None
        room = self._stretch_cap(latest) - latest.bs
        if room <= 0:
            return None
        newcomers = list(self.pending)[:room]
        if self.t_comp_wait_rule == "qos":
            oldest = min(q.arrival for q in latest.queries)
            finish = self.merged_finish(latest, newcomers, now)
            if finish - oldest > self.qos_target_ms + time_eps(now):  # type: ignore[operator]  # qos: a target
                return None
        elif self.t_comp_wait_rule != "none":
            processed = 0.0 if math.isnan(latest.first_start) else now - latest.first_start
            if processed > self.t_comp_wait_ms + time_eps(now):
                return None
        if self.max_stretch_stage is not None:
            front = 0  # the furthest stage the batch has been handed to (a loop: no builtin max compiled)
            for s_ in range(latest.n_stages):
                if latest.issued[s_] > 0:
                    front = s_
            if front >= self.max_stretch_stage:
                return None
        queries = self.take(room)
        splittable = False
        if self.use_split:
            # the merged batch is whole again at the boundary after the furthest stage its queries were handed to
            front = max(s for s in range(latest.n_stages) if latest.issued[s] > 0)
            seq_len = max(q.seq_len for q in (*latest.queries, *queries)) if self.has_len else None
            splittable = self._would_split(front, latest.bs + len(queries), seq_len)
        return Stretch(latest.bid, queries, splittable=splittable)

    def _stretch_cap(self, batch) -> int:
        """The size Policy III stretches ``batch`` up to: the batch size that fully utilizes the hardware in the
        stages the merged batch will run together (the largest preferred batch size among them, §3.3's
        "insufficient batches ... merged into a new batch that fully utilizes the hardware"), at most bs_max."""
        front = -1 if math.isnan(batch.first_start) else max(s for s in range(batch.n_stages) if batch.issued[s] > 0)
        return min(self.max_batch_size, max(self.preferred[front + 1:]))

    def _joinable_rows(self, batch) -> int:
        """How many of ``batch``'s rows wait, not yet pulled, in its first stage's queue as the item a stretch's
        newcomers join (the engine's batch queues where the view has them; else 0: run apart, the upper bound on
        a table whose time grows at most linearly with the batch size)."""
        lanes = getattr(self.view, "lanes", None)
        if not lanes or not 0 <= batch.lane < len(lanes):
            return 0
        for item in lanes[batch.lane].queues[0]:
            if item.bid == batch.bid and item.start + item.num == batch.bs:
                return item.num
        return 0

    def merged_finish(self, batch, newcomers, now) -> float:
        """When ``batch`` stretched now by ``newcomers`` would leave the last stage, from the latency table's
        standalone times run one after another (Policy III's QoS rule; see the module docstring): the work the
        batch's own queries still have up to the merge boundary (the furthest stage any of them has been handed
        to), the newcomers' catch-up through every stage up to that boundary at their own size, then the remaining
        stages at the merged size, padded to the merged batch's longest input. A batch not yet started runs merged
        from the first stage."""
        prof = self.view.profile
        n_st = prof.n_stages
        n = batch.bs + len(newcomers)
        seq = self.has_len

        def t(stage, rows):  # one execution of these rows at ``stage``, padded to their longest input
            return prof.latency(stage, len(rows), max(q.seq_len for q in rows) if seq else None) if rows else 0.0

        if math.isnan(batch.first_start):  # still queued for the first stage: the newcomers join its item
            longest = max(q.seq_len for q in (*batch.queries, *newcomers)) if seq else None
            return now + prof.remaining(0, n, longest)
        front = max(s for s in range(n_st) if batch.issued[s] > 0)
        work = 0.0  # up to the merge boundary: the batch's own rows and the newcomers' catch-up
        qs = batch.queries
        run_t, run_since = 0.0, now  # the batch's running executions: their standalone times, the first start
        for s in range(front + 1):
            # rows complete a stage in the order they were handed to it: [0, done) are done, then come the running
            # execution, the rows handed to the stage but not started (one item), and the rows not yet handed to
            # it (earlier newcomers still catching up), which go on together with the newcomers once every row has
            # completed the stage before
            done, handed = batch.status_map[s], batch.issued[s]
            running = [q for q in qs[done:handed] if not math.isnan(q.stage_start[s])]
            if running:
                run_t += t(s, running)
                run_since = min(run_since, running[0].stage_start[s])
            queued, later = qs[done + len(running):handed], qs[handed:]
            if s == 0:
                # the newcomers join the batch's catch-up item still waiting in the first stage's queue, if any (as
                # the pipeline's stretch does), not one that the executor has already pulled
                j = self._joinable_rows(batch)
                work += t(0, queued[:len(queued) - j]) + t(0, [*queued[len(queued) - j:], *newcomers])
            else:
                work += t(s, queued) + t(s, [*later, *newcomers])
        if run_t > 0:
            # what the running executions still need: all of them, less the time the device has had for them
            # since the first started -- one device, which the batch's own executions finished since then had
            # first (a catch-up launched beside its batch's stage runs after it on a device that serializes)
            busy = sorted({(max(q.stage_start[s], run_since), q.stage_finish[s]) for q in qs for s in range(n_st)
                           if not math.isnan(q.stage_finish[s]) and q.stage_finish[s] > run_since})
            other, reach = 0.0, run_since
            for a, b in busy:  # the measure of their union
                if b > reach:
                    other += b - max(a, reach)
                    reach = b
            work += max(0.0, run_t - (now - run_since - other))
        longest = max(q.seq_len for q in (*qs, *newcomers)) if seq else None
        rest = prof.remaining(front + 1, n, longest) if front + 1 < n_st else 0.0
        return now + work + rest

    def next_wakeup(self, now: float):
        if self.pending and self._room() > 0:
            w = self.window()
            if w > 0:
                t = self.pending[0].seen + w
                return t if t > now + time_eps(now) else math.inf
        return math.inf


# registered here rather than by a decorator: mypyc compiles a class with any decorator but mypyc_attr as a
# slower non-native class (dvasim.compiled)
register(DVABatch)


def fluid_finish_times(jobs: list[tuple[float, float]]) -> list[float]:
    """Finish times of jobs ``(standalone_time, demand)`` that all start at 0 and share one device fluidly:
    all run at full speed while their demands sum to at most 1, else each at rate ``1 / sum(demands)``."""
    remaining = [t for t, _ in jobs]
    done = [math.inf] * len(jobs)
    active = set(range(len(jobs)))
    now = 0.0
    while active:
        total = left_sum([jobs[k][1] for k in active])
        rate = 1.0 if total <= 1.0 + EPS else 1.0 / total
        k_next = min(active, key=lambda k: remaining[k])
        dt = remaining[k_next] / rate
        now += dt
        for k in list(active):
            remaining[k] -= dt * rate
            if remaining[k] <= EPS * max(1.0, jobs[k][0]):
                done[k] = now
                active.discard(k)
    return done


def serial_host_cost(served, n_stages: int):
    """The host work a batch's launches do one at a time on the stack (``served``, a resolved serving stack): a
    function ``(rows, seq_len) -> ms``, or None where the stack adds no serial host work (gpu-only, a host without an
    interpreter lock). It is the work that holds the interpreter lock: each stage launch's Python-level copies and
    overhead (``HostModel.locked``), the launch itself for eager modules (``locks_launch``), and the batch's entry
    when the serving loop is Python (``BatchCosts.python_level``). Launches on their own cores run side by side
    and are not counted."""
    host = getattr(served, "host", None)
    batch = getattr(served, "batch", None)
    if host is None:
        return None
    entry = batch is not None and getattr(batch, "python_level", False)
    if not entry and not host.holds_lock:
        return None

    def cost(rows: int, seq_len: int) -> float:
        L = seq_len if seq_len else None
        t = left_sum([host.locked(s, rows) + (host.launch(s, rows, L) if host.locks_launch else 0.0)
                      for s in range(n_stages)])
        return t + (batch.entry_host_ms(rows, L) if entry else 0.0)

    return cost


def _mean_demand(prof, bs, seq_len) -> float:
    n = prof.n_stages
    return left_sum([prof.demand(s, bs, seq_len) for s in range(n)]) / n


@mypyc_attr(allow_interpreted_subclasses=True)
class DVABatchSplit(DVABatch):
    """DVABatch with only *split* enabled (paper Figure 18), behind a Triton-style batch window."""

    name = "dvabatch-split"
    default_policies = ("operator",)


register(DVABatchSplit)
