"""LazyBatching (Choi et al., HPCA'21 §IV): node-level lazy batching under an SLA-aware slack predictor.

What LazyBatching does (paper §IV-A/B, Figure 10): the scheduler runs one node at a time. When a request arrives
while a batch executes, the slack-time predictor decides whether merging it would violate the SLA. If not, the
active batch is preempted at the end of its current node, the newcomer is pushed on the BatchTable's stack and
executes the nodes the active batch has already done; when two stack entries reach the same node they merge and
continue as one batch. If the predictor refuses, the scheduler "does not try to batch more inputs and authorize[s]
the currently active batch to complete its execution uninterrupted".

How it maps onto dvasim's mechanism (the DVABatch paper: "DVABatch degenerates to LazyBatch if we slice the model
into the granularity of operators and only enable stretch"):

* a node is a stage (slice the model per operator for LazyBatching's granularity: ``[model] stages`` = the
  number of operators of a named model);
* *push* at a node boundary is a :class:`~dvasim.policies.base.Stretch` returned by :meth:`LazyBatch.at_boundary`:
  the newcomers' item goes to the first stage's queue and catches up through the stages the batch has done, while
  the batch waits at that boundary (``status_map``); the *merge* of two stack entries at the same node is the
  batch table's hand-on of every row once all of them have completed that stage. ``at_boundary`` is called again
  when the newcomers reach a boundary the older rows wait at (or any boundary on the way, e.g. the first stage),
  and may push again there: exactly the paper's Figure 10 (tested step by step in ``tests/policies/test_lazybatch.py``);
* a *new* batch is formed only when the instance holds no batch: every pending request (up to
  ``max_batch_size``) leaves as one batch, since all of them are at the first node. Pending requests the
  predictor refused wait until the active batch has left (a batch refused once is closed: no later push);
* because a push happens only at a boundary, when the batch's only execution has finished, one node executes at a
  time (the NPU's model), whatever the device-sharing mode, with one instance.

Slack predictor (§IV-C), ``predictor``:

* ``"conservative"`` (the paper's LazyB, Equation 2): ``Slack = SLA - (T_wait + sum_{i=1..N}
  SingleInputExecTime_i)``, where N is the batch's size after the merge and ``SingleInputExecTime`` is the whole
  graph's latency at batch 1 (Algorithm 1; the full graph, not what remains: the paper's conservative choice).
  A newcomer is merged only when ``Slack >= 0``. T_wait is the paper's "initial input's wait in InfQ before its
  first issue"; generalised here (ours) to the *largest* wait among the batch's requests (admission time minus the
  time the front door saw it) and the candidates (now minus seen, a wait that is still growing), so that every
  merged request's own ``T_wait + sum`` is bounded;
* ``"oracle"`` (the paper's Oracle): the exact latency from the table: the newcomers' catch-up through the stages
  the stack's entries have done (each segment at the size of the entries merged so far, padded to their longest
  input), then the merged batch to the end; merged only when every request of the batch would finish within the
  SLA (``finish - seen <= sla_ms``), with no further merges assumed (each later merge is checked again).

Candidates are tried one at a time in arrival order at each boundary; the first refusal closes the batch (so the
arrival order is kept: a later request never overtakes a refused one into the batch).

Dynamic graphs (Algorithm 1's ``dec_timesteps``): dvasim's latency tables have no per-node "decoder timestep"
axis (no STATIC / ENCODER / DECODER node types); a table's only input-dependent dimension is the sequence-length
column ``seq_len``. So Algorithm 1 is represented as: on a table with ``seq_len``, the conservative predictor
estimates every input's ``SingleInputExecTime`` at ``seq_len = dec_timesteps`` (the length it must assume, unknown
at run time), while execution runs at the inputs' real lengths (and the oracle knows them). ``dec_timesteps``
defaults to the ``dec_coverage`` quantile (the paper's N = 90%) of the service's input-length sample (the smallest
length covering at least that share of it), or to the table's longest length when there is no sample. On a table
without ``seq_len`` it is unused (a static graph: Algorithm 1 lines 4-5).

Assumed where the paper is silent (ours): T_wait counts from the time the front door saw a request (its arrival
plus any ``[engine] admission_delay_ms``); with ``[engine] instances`` > 1 a new batch goes to any free instance
and only the batch table's latest batch is pushed on (so nodes of different instances may overlap); the SLA
defaults to the run's ``[qos] target_ms`` (100 ms, the paper's §VI-A value, when the engine has none).
"""

from __future__ import annotations

import math

from dvasim.core.arith import left_sum
from dvasim.errors import ConfigError
from dvasim.policies.base import (
    FrontDoorPolicy,
    New,
    Stretch,
    check_nonneg_number,
    check_positive_int,
    register,
    time_eps,
)

PREDICTORS = ("conservative", "oracle")
DEFAULT_SLA_MS = 100.0
DEFAULT_DEC_COVERAGE = 0.9


def coverage_length(lengths, coverage: float) -> int:
    """The smallest length L of ``lengths`` such that at least ``coverage`` of them are <= L."""
    xs = sorted(int(x) for x in lengths)
    k = max(1, math.ceil(coverage * len(xs) - 1e-9))
    return xs[min(k, len(xs)) - 1]


@register
class LazyBatch(FrontDoorPolicy):
    __doc__ = __doc__

    name = "lazybatch"
    params = {
        "max_batch_size": "the model-allowed maximum batch size (LazyBatching: 64)",
        "sla_ms": "SLA_target of the slack predictor, ms (default: the run's [qos] target_ms, else 100)",
        "predictor": '"conservative" (Equation 2, the paper\'s LazyB) or "oracle" (exact batched latency)',
        "dec_timesteps": "the input length the conservative predictor assumes on a table with seq_len "
                         "(Algorithm 1's dec_timesteps; default: the dec_coverage quantile of the input lengths)",
        "dec_coverage": "share of the input lengths dec_timesteps covers by default (the paper's N; default 0.9)",
    }

    def __init__(self, max_batch_size=64, sla_ms=None, predictor="conservative", dec_timesteps=None,
                 dec_coverage=DEFAULT_DEC_COVERAGE):
        super().__init__()
        self.max_batch_size = check_positive_int("policy.max_batch_size", max_batch_size)
        self._sla = None if sla_ms is None else check_nonneg_number("policy.sla_ms", sla_ms)
        if self._sla is not None and self._sla <= 0:
            raise ConfigError("policy.sla_ms", f"must be a number > 0, got {sla_ms!r}")
        if predictor not in PREDICTORS:
            raise ConfigError("policy.predictor", f"must be one of {', '.join(PREDICTORS)}; got {predictor!r}")
        self.predictor = predictor
        self._dec = None if dec_timesteps is None else check_positive_int("policy.dec_timesteps", dec_timesteps)
        cov = check_nonneg_number("policy.dec_coverage", dec_coverage)
        if not 0 < cov <= 1:
            raise ConfigError("policy.dec_coverage", f"must be in (0, 1], got {dec_coverage!r}")
        self.dec_coverage = cov
        self.sla_ms = self._sla if self._sla is not None else DEFAULT_SLA_MS
        self.dec_timesteps = self._dec
        self._closed: set[int] = set()  # batches the predictor refused once: they complete uninterrupted
        self.n_refused = 0  # refusals (each closes a batch)

    # ------------------------------------------------------------------ setup
    def bind(self, view) -> None:
        super().bind(view)
        prof = view.profile
        if self.max_batch_size > prof.max_batch_size:
            raise ConfigError("policy.max_batch_size",
                              f"{self.max_batch_size} exceeds the table's largest profiled batch size "
                              f"{prof.max_batch_size}")
        if self._sla is None:
            qos = getattr(view, "qos_target_ms", None)
            self.sla_ms = float(qos) if qos else DEFAULT_SLA_MS
        seq_lens = getattr(prof, "seq_lens", None)
        self.has_len = seq_lens is not None
        if self.has_len:
            top = int(max(seq_lens))
            if self._dec is not None:
                if self._dec > top:
                    raise ConfigError("policy.dec_timesteps",
                                      f"{self._dec} exceeds the table's longest profiled length {top}")
            else:
                lengths = getattr(view, "input_lengths", None)
                self.dec_timesteps = (coverage_length(lengths, self.dec_coverage)
                                      if lengths is not None and len(lengths) else top)
        self.single_ms = prof.remaining(0, 1, self.dec_timesteps if self.has_len else None)

    def describe(self) -> dict:
        d = {"name": self.name, "max_batch_size": self.max_batch_size, "sla_ms": self.sla_ms,
             "predictor": self.predictor, "dec_coverage": self.dec_coverage}
        if self.dec_timesteps is not None:
            d["dec_timesteps"] = self.dec_timesteps
        if self.view is not None:
            d["single_input_exec_ms"] = self.single_ms
        return d

    # ------------------------------------------------------------------ the front door
    def admit(self, now: float):
        ops = []
        free = self.view.free_instances()
        while self.pending and len(ops) < free:
            ops.append(New(self.take(self.max_batch_size)))
        return ops

    # ------------------------------------------------------------------ node boundaries
    def at_boundary(self, batch, stage: int, now: float):
        if not self.pending or batch.bid in self._closed:
            return None
        table = self.view.table
        if table.can_stretch(batch.bid) is not None:  # only the latest batch, not yet at the last stage
            return None
        room = self.max_batch_size - batch.bs
        taken = []
        while self.pending and len(taken) < room:
            cand = self.pending[0]
            if not self.authorise(batch, stage, [*taken, cand], now):
                # only the latest batch can be pushed onto: remembering it alone keeps memory flat on long runs
                self._closed = {batch.bid}
                self.n_refused += 1
                break
            taken.append(self.pending.popleft())
        return Stretch(batch.bid, taken) if taken else None

    def authorise(self, batch, stage: int, newcomers, now: float) -> bool:
        """Would merging ``newcomers`` into ``batch`` (at the boundary after ``stage``) keep the SLA?"""
        if self.predictor == "conservative":
            return self.slack(batch, newcomers, now) >= -time_eps(now)
        finish = self.oracle_finish(batch, stage, newcomers, now)
        first_seen = min(q.seen for q in (*batch.queries, *newcomers))
        return finish - first_seen <= self.sla_ms + time_eps(finish)

    def slack(self, batch, newcomers, now: float) -> float:
        """Equation 2: ``SLA - (T_wait + N * SingleInputExecTime)`` for ``batch`` merged with ``newcomers``."""
        waits = [q.admitted - q.seen for q in batch.queries] + [now - q.seen for q in newcomers]
        n = batch.bs + len(newcomers)
        return self.sla_ms - (max(waits) + n * self.single_ms)

    def oracle_finish(self, batch, stage: int, newcomers, now: float) -> float:
        """When ``batch`` merged with ``newcomers`` now would leave the last stage, from the table (no later merge).

        The batch's rows form a stack: rows handed on to stage ``k`` (and done with it) wait at boundary ``k``; the
        rows that just completed ``stage`` are the top. The newcomers run the stages up to the top's boundary at
        their own size, merge, run on to the next entry's boundary at the merged size, and so on; then the whole
        batch runs the remaining stages."""
        prof = self.view.profile
        n_st = prof.n_stages
        issued = batch.issued
        # the boundary each row waits at: the last stage it was handed to (and completed)
        groups = []  # (boundary, its rows' queries), the top (lowest boundary) first
        for k in range(stage, n_st):
            lo = issued[k + 1] if k + 1 < n_st else 0
            if lo < issued[k]:
                groups.append((k, batch.queries[lo:issued[k]]))
        members = list(newcomers)
        t = now
        at = -1
        for boundary, qs in groups:
            t += self._run(prof, at + 1, boundary + 1, members)
            members.extend(qs)
            at = boundary
        return t + self._run(prof, at + 1, n_st, members)

    def _run(self, prof, first: int, end: int, members) -> float:
        if first >= end:
            return 0.0
        seq = max(q.seq_len for q in members) if self.has_len else None
        b = len(members)
        return left_sum(prof.latency(s, b, seq) for s in range(first, end))
