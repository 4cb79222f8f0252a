"""The characterization study's setup and micro-scenarios (Yu et al., "Characterizing and understanding deep neural
network batching systems on GPUs", BenchCouncil TBench 2024), for ``experiments/study_maxbs.py`` and
``experiments/study_slicing.py``.

**Setup mapped onto dvasim** (every choice below is ours where the study is silent):

* GPU: the study's NVIDIA A100 (TensorRT 8.2) -> the modelled ``a100`` tables (``traces/gpu/README.md``: checked
  against this very study; ResNet-152 and BERT-base within 25% at large batches, LinkNet 2.5-7x too fast at the
  shipped 256x256 input).
* Models: ResNet = ``resnet152``, BERT = ``bert_base`` at sequence length 384 (:data:`BERT_SEQ_LEN`; the study
  does not say, 384 is the length under which the a100 table matches its Table 3), LinkNet = ``linknet``.
* Client: the study's Triton client sends requests at a constant rate ("a uniform distribution"): ``[workload]
  kind = "uniform"`` (evenly spaced arrivals); QoS target 200 ms.
* Triton baseline: ``delaybatch`` with the study's windows (§4.2: 500 us ResNet, 10 us BERT and LinkNet) and
  ``max_batch_size`` = MAX-BS; the model runs whole (one stage).
* Loads: low / medium / high = 1/4, 3/5, 9/10 of the peak of DVABatch (the study's reference, §3.1), here the
  capacity (:func:`dvasim.studies.capacity.capacity`, p99 within 200 ms) of strategy VIII (stretch, split, pipeline on,
  ``policies = []``) with the study-default slicing (:data:`dvasim.studies.evaluation.MODELS` stage counts).
* Serving stack: the study's Triton 22.05 with TensorRT 8.2 -> ``triton-tensorrt`` (the one the a100 tables imply;
  :func:`config` and :func:`served` take another by name, e.g. ``gpu-only`` for the GPU alone). Its launch cost
  (0.29 / 4 ms per stage launch, DVABatch §8.8, plus 5 us per operator) is the per-stage cost; ``[engine]
  launch_overhead_ms`` adds to it.
* Slicing ratio (§5.1): the share of the model's time in ``Stage_0`` -> ``[model] ratios = [r, 1 - r]``
  (:func:`dvasim.model.slicing.slice_ratios`: the cut at the operator boundary nearest to ``r`` of the
  batch-1 time; :func:`stage_shares` gives the share a table really has).

**Micro-scenarios** (§6.2, §6.3; the study's Figures 13 to 16), run through the real :class:`Pipeline` and SimPy
engine with a scripted policy (:class:`ScriptedBatches`, not registered: it is only for these scenarios):

* :func:`split_scenario` -- one batch of ``N`` queries arrives at once; *naive* runs it whole through both
  stages; *split* runs ``Stage_0`` at ``N`` and then ``n`` sub-batches of ``N/n`` through ``Stage_1`` one after
  another (the serial manner). Speedup = mean latency naive / mean latency split.
* :func:`stretch_scenario` -- ``BS_0`` starts ``Stage_0`` at time 0 and ``BS_1`` arrives just after; *stretch*
  appends ``BS_1`` to ``BS_0`` (it catches up through ``Stage_0`` after ``BS_0`` and the merged batch runs
  ``Stage_1``); without stretch ``BS_1`` is a batch of its own, after ``BS_0`` has left the model (``baseline =
  "naive"``, the study's naive batching) or entering ``Stage_0`` as soon as it is free (``"pipelined"``).
  Speedup = mean latency without / with stretch (over all queries of both batches).

Both take ``stack`` (a :func:`served` result): the stack's launch model and per-batch host costs (request
handling, input gathering and copy on entry, for the rows a stretch adds too; synchronisation and output copy on
exit, for every sub-batch of a split); without one they run the GPU alone, as the hand-worked tests do.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dvasim.policies.base import New, Policy, Split, Stretch

DEVICE = "a100"
BERT_SEQ_LEN = 384
QOS_MS = 200.0
PAPER_NAMES = {"resnet152": "ResNet", "bert_base": "BERT", "linknet": "LinkNet"}
MODELS = tuple(PAPER_NAMES)
TRITON_WINDOW_MS = {"resnet152": 0.5, "bert_base": 0.01, "linknet": 0.01}  # the study's §4.2
STUDY_PEAK_QPS = {"resnet152": 4288.0, "bert_base": 1088.0, "linknet": 3264.0}  # §3.1 (Model Analyzer, DVABatch)
LOADS = {"low": 1 / 4, "medium": 3 / 5, "high": 9 / 10}
MAX_BS = (1, 2, 4, 8, 16, 32, 64)
# Table 5's eight strategies in its row order: (stretch, split, pipeline) as bits
TABLE5_STRATEGIES = {"I": (0, 0, 0), "II": (0, 0, 1), "III": (0, 1, 0), "IV": (0, 1, 1), "V": (1, 0, 0),
                     "VI": (1, 0, 1), "VII": (1, 1, 0), "VIII": (1, 1, 1)}
# the ones the slicing sweeps use
STRATEGIES = {k: TABLE5_STRATEGIES[k] for k in ("I", "II", "VIII")}


def ratio_grid(step: float = 0.05, lo: float | None = None, hi: float | None = None) -> list[float]:
    """Slicing ratios ``lo, lo + step, ..., hi`` (default ``step .. 1 - step``), rounded to 1e-9 so that they
    print cleanly; every one strictly inside (0, 1)."""
    if not 0 < step < 1:
        raise ValueError(f"step must be in (0, 1), got {step!r}")
    lo = step if lo is None else float(lo)
    hi = 1.0 - step if hi is None else float(hi)
    if not 0 < lo <= hi < 1:
        raise ValueError(f"need 0 < lo <= hi < 1, got lo={lo!r}, hi={hi!r}")
    n = int(math.floor((hi - lo) / step + 1e-9)) + 1
    return [round(lo + k * step, 9) for k in range(n)]


def model_cfg(model: str, *, ratio: float | None = None, stages: int | None = None,
              device: str = DEVICE) -> dict[str, Any]:
    """The ``[model]`` section: two stages cut at slicing ratio ``ratio``, or ``stages`` time-even stages."""
    if (ratio is None) == (stages is None):
        raise ValueError("give exactly one of ratio or stages")
    if ratio is not None:
        return {"name": model, "device": device, "ratios": [float(ratio), 1.0 - float(ratio)]}
    return {"name": model, "device": device, "stages": int(stages)}


def seq_len_of(model: str) -> int | None:
    return BERT_SEQ_LEN if model.startswith("bert") else None


def workload(model: str, rate_qps: float, n_queries: int, *, kind: str = "uniform", seed: int = 1) -> dict:
    wl: dict[str, Any] = {"kind": kind, "rate_qps": float(rate_qps), "n_queries": int(n_queries), "seed": int(seed)}
    if seq_len_of(model):
        wl["seq_len"] = seq_len_of(model)
    return wl


def config(model_section: dict, policy: dict, wl: dict, *, launch_overhead_ms: float = 0.0,
           stack: str | None = None) -> dict[str, Any]:
    """A run's config. ``stack``: the serving stack by name (``[server] stack``); default: the one the table
    implies (``triton-tensorrt`` for the a100 tables, the study's Triton + TensorRT). ``launch_overhead_ms`` is
    ``[engine] launch_overhead_ms``, a delay before every stage launch *added to* the stack's own launch cost."""
    cfg = {"model": dict(model_section), "policy": {"max_batch_size": 64, **policy}, "workload": dict(wl),
           "qos": {"target_ms": QOS_MS},
           "engine": {"buffer_pairs": 2, "progress": False, "launch_overhead_ms": float(launch_overhead_ms)}}
    if stack is not None:
        cfg["server"] = {"stack": stack}
    return cfg


def served(model_section: dict, stack: str | None = None):
    """The serving stack a run of ``model_section`` gets (:class:`dvasim.server.resolve.StackRun`: its host model
    and per-batch costs, for the table as sliced), for the scripted scenarios; ``stack`` as in :func:`config`."""
    from dvasim import config as cfgmod
    from dvasim.model.catalog import resolve_model
    from dvasim.server.resolve import resolve_stack

    cfg = cfgmod.resolve(config(model_section, {"name": "zerobatch"}, workload(model_section["name"], 1.0, 1),
                                stack=stack))
    return resolve_stack(cfg, resolve_model(cfg["model"]))


def strategy_policy(label: str) -> dict[str, Any]:
    """Table 5's strategy ``label`` (I ... VIII) as DVABatch flags, without Policy I-III identification."""
    st, sp, pl = TABLE5_STRATEGIES[label]
    return {"name": "dvabatch", "policies": [], "stretch": bool(st), "split": bool(sp), "pipeline": bool(pl)}


def triton_policy(model: str, max_bs: int) -> dict[str, Any]:
    return {"name": "delaybatch", "max_queue_delay_ms": TRITON_WINDOW_MS[model], "max_batch_size": int(max_bs)}


def capacity_qps(cfg: dict, *, quick: bool = False) -> tuple[float, float]:
    """(capacity under p99 <= 200 ms, the bracket's top; ``inf`` if never exceeded) of ``cfg``'s policy and model
    under its workload kind (:func:`dvasim.studies.evaluation.capacity_of`: 2% resolution, or 5% with ``quick``)."""
    from dvasim.studies.evaluation import capacity_of

    cap, (_, top) = capacity_of(cfg, QOS_MS, full=not quick)
    return float(cap), float(top)


def stage_shares(profile, batch_size: int = 1, seq_len: int | None = None) -> np.ndarray:
    """Each stage's share of the model's time at ``batch_size`` (and ``seq_len``)."""
    t = np.array([profile.latency(s, batch_size, seq_len) for s in range(profile.n_stages)])
    return t / t.sum()


# ----------------------------------------------------------------------------- micro-scenarios
class ScriptedBatches(Policy):
    """Forms the given batches in order (``groups``: their sizes; queries arrive in that order) and applies the
    scripted operations: ``actions[k]`` is ``"new"`` (a batch of its own, entering the first stage as soon as it
    is free), ``"new-after"`` (a batch of its own, entering only when the pipeline holds no batch: no pipelined
    execution) or ``"stretch"`` (appended to the latest batch). ``split = (k, stage, n)`` splits group ``k``'s
    batch into ``n`` equal sub-batches (serial manner) once it has completed ``stage``."""

    name = "scripted"

    def __init__(self, groups: list[int], actions: list[str], split: tuple[int, int, int] | None = None):
        super().__init__()
        if len(groups) != len(actions) or not groups:
            raise ValueError("one action per group")
        self.groups, self.actions, self.split = list(groups), list(actions), split
        self.next = 0

    def admit(self, now: float):
        ops = []
        while self.next < len(self.groups) and len(self.pending) >= self.groups[self.next]:
            k, action = self.next, self.actions[self.next]
            if action == "new-after" and self.view.free_instances() == 0:
                break
            qs = self.take(self.groups[k])
            if action == "stretch":
                latest = self.view.table.latest_id
                if latest is None:
                    raise ValueError("stretch needs a batch before it")
                ops.append(Stretch(latest, qs))
            else:
                ops.append(New(qs, splittable=self.split is not None and self.split[0] == k))
            self.next += 1
        return ops

    def at_boundary(self, batch, stage: int, now: float):
        if self.split is not None:
            k, at_stage, n = self.split
            if stage == at_stage and batch.splittable and batch.parent is None and batch.bs == self.groups[k]:
                if batch.bs % n:
                    raise ValueError(f"cannot split {batch.bs} into {n} equal sub-batches")
                return Split(batch.bid, [batch.bs // n] * n, manner="serial")
        return None


def run_script(profile, groups: list[int], times_ms: list[float], actions: list[str],
               split: tuple[int, int, int] | None = None, seq_len: int | None = None, stack=None) -> np.ndarray:
    """Latency (ms) of every query of a scripted scenario: group ``k`` of ``groups[k]`` queries arrives at
    ``times_ms[k]``; two buffer pairs, fluid device sharing, one instance. ``stack``: a :func:`served` result (the
    stack's launch model and per-batch costs); None: the GPU alone."""
    from dvasim.core.pipeline import Pipeline
    from dvasim.engines.sim.engine import simulate

    pol = ScriptedBatches(groups, actions, split)
    pipe = Pipeline(profile, pol, 2)
    arrivals = [float(t) for t, g in zip(times_ms, groups, strict=True) for _ in range(g)]
    n = len(arrivals)
    host = {} if stack is None else {"host": stack.host, "batch_costs": stack.batch,
                                     "corun_per_worker": stack.corun_per_worker}
    res = simulate(pipe, arrivals, [seq_len or 1] * n, sharing="fluid", **host)
    if res.stuck is not None:
        raise RuntimeError(f"scripted scenario did not finish: {res.stuck}")
    lat = np.array([q.finish - q.arrival for q in res.queries])
    if np.isnan(lat).any():
        raise RuntimeError("scripted scenario: some queries did not finish")
    return lat


def split_scenario(profile, batch_size: int, n_sub: int = 2, seq_len: int | None = None,
                   stack=None) -> dict[str, float]:
    """One batch of ``batch_size`` queries arriving at once, split into ``n_sub`` sub-batches after ``Stage_0``
    (the study's Figures 13 and 14), against naive batching; ``stack`` as in :func:`run_script`."""
    naive = run_script(profile, [batch_size], [0.0], ["new"], seq_len=seq_len, stack=stack)
    split = run_script(profile, [batch_size], [0.0], ["new"], split=(0, 0, n_sub), seq_len=seq_len, stack=stack)
    return {"naive_mean_ms": float(naive.mean()), "split_mean_ms": float(split.mean()),
            "speedup": float(naive.mean() / split.mean())}


STRETCH_GAP_MS = 1e-3  # BS_1 arrives this long after BS_0 (which has then just started Stage_0)


def stretch_scenario(profile, bs0: int, bs1: int, seq_len: int | None = None,
                     baseline: str = "naive", stack=None) -> dict[str, float]:
    """``BS_0`` arrives at 0, ``BS_1`` :data:`STRETCH_GAP_MS` later (the study's Figures 15 and 16): stretched into
    ``BS_0``, or (``baseline``) a batch of its own, after ``BS_0`` has left (``"naive"``) or pipelined
    (``"pipelined"``); ``stack`` as in :func:`run_script`."""
    if baseline not in ("naive", "pipelined"):
        raise ValueError(f"baseline must be 'naive' or 'pipelined', got {baseline!r}")
    times = [0.0, STRETCH_GAP_MS]
    without = run_script(profile, [bs0, bs1], times, ["new", "new-after" if baseline == "naive" else "new"],
                         seq_len=seq_len, stack=stack)
    stretched = run_script(profile, [bs0, bs1], times, ["new", "stretch"], seq_len=seq_len, stack=stack)
    return {"without_mean_ms": float(without.mean()), "stretch_mean_ms": float(stretched.mean()),
            "speedup": float(without.mean() / stretched.mean())}
