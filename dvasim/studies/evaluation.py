"""The paper's evaluation methodology (§8): stepping load, peak throughput under the QoS target, DelayBatch's
window tuned for peak throughput, the low / medium / high loads, and the comparison of the batching policies.

Definitions (ours where the paper is silent):

* **Stepping load** (§8.3): Poisson arrivals starting at 66 QPS, the rate raised every 2,000 queries in geometric
  steps, reaching 4,000 QPS after 30,000 queries (32,000 queries in all).
* **Peak throughput**: the highest offered rate whose queries keep their p99 latency within the QoS target
  (200 ms), found in two steps: the stepping load brackets it between two levels (the last level that, with every
  level before it, stays within the target, and the next), then ``refine`` bisection steps at constant-rate
  Poisson loads of ``refine_queries`` queries narrow the bracket (the steps are 31% apart; four bisections bring
  the resolution to about 2%).
* **Loads**: low / medium / high = 1/4, 3/5, 9/10 of the benchmark's peak throughput under DelayBatch (the tuned
  production baseline), so every policy is compared at the same offered loads.
* **DelayBatch's window** is tuned for the highest peak throughput (ties: the smaller window) over windows that
  are multiples of the model's latency at batch size 1.

**Variants** (:data:`VARIANTS`): besides the paper's three systems and DVABatch as its authors built it
(``dvabatch-built``, :mod:`dvasim.policies.dvabatch_built`), every load also runs Triton with two model
instances (``zerobatch-x2``, ``delaybatch-x2``: ``[engine] instances = 2``, Triton's ``instance_group`` count 2),
DVABatch behind DelayBatch's tuned window (``dvabatch-window``), and DVABatch's cumulative ablations:
``dva-multientry`` (``policies = []``: batches enter the pipeline whenever the first stage takes them, no stretch,
split or clustering), ``dva+stretch`` (``["load"]``), ``dva+split`` (``["load", "operator"]``) and, for models
whose table has a sequence length, ``dva+input`` (``["load", "operator", "input"]``). :func:`attribution` splits
DVABatch's mean-latency reduction against DelayBatch into these steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import pandas as pd

from dvasim.progress import progress_bar
from dvasim.reporting import plots

QOS_MS = 200.0
BS_MAX = 64
LOADS = {"low": 1 / 4, "medium": 3 / 5, "high": 9 / 10}
STEPPING = {"start_qps": 66.0, "end_qps": 4000.0, "step_queries": 2000, "n_queries": 32000}

# per-model defaults: the paper's best stage counts where it gives them (§8.7), 4 otherwise
MODELS: dict[str, dict[str, Any]] = {
    "bert_base": {"stages": 2, "seq_len_dist": "glue:RTE"},
    "bert_large": {"stages": 2, "seq_len_dist": "glue:RTE"},
    "resnet152": {"stages": 4},
    "vgg19": {"stages": 4},
    "unet": {"stages": 4},
    "linknet": {"stages": 4},
}
POLICIES = ("zerobatch", "delaybatch", "dvabatch")  # the paper's three systems
DVA_SYSTEMS = ("dvabatch", "dvabatch-built")  # DVABatch as described (§7) and as its authors built it
WINDOW = "tuned"  # placeholder in a variant's policy: DelayBatch's tuned window of the model
MATCH_TOLERANCE = 0.02  # a baseline "matches" DVABatch when its mean latency is at most 2% above DVABatch's


@dataclass(frozen=True)
class Variant:
    """One compared system: ``policy`` (``max_queue_delay_ms = WINDOW`` stands for DelayBatch's tuned window of the
    model), ``engine`` overrides of ``[engine]``, whether it runs only on token models (tables with a
    ``seq_len``), and whether the study's batch limit :data:`BS_MAX` is imposed on it (the peer systems keep
    their papers' own limits)."""

    label: str
    policy: dict[str, Any]
    engine: dict[str, Any] = field(default_factory=dict)
    token_only: bool = False
    doc: str = ""
    study_batch_limit: bool = True  # the study's max_batch_size (BS_MAX); False: the policy's own default
    whole: bool = False  # runs the model unsliced (one stage): Triton runs a TensorRT engine whole

    def policy_for(self, window: float) -> dict[str, Any]:
        """The policy dict with the tuned window filled in."""
        return {k: (window if isinstance(v, str) and v == WINDOW else list(v) if isinstance(v, list) else v)
                for k, v in self.policy.items()}


_DELAY = {"name": "delaybatch", "max_queue_delay_ms": WINDOW}
VARIANTS: tuple[Variant, ...] = (
    Variant("zerobatch", {"name": "zerobatch"}, doc="Triton, no batch window", whole=True),
    Variant("delaybatch", _DELAY, doc="Triton, window tuned for peak throughput", whole=True),
    Variant("dvabatch", {"name": "dvabatch"}, doc="DVABatch, policies identified from the table (§7.1)"),
    Variant("dvabatch-built", {"name": "dvabatch-built"},
            doc="DVABatch as its authors' backend schedules it (github sjtu-epcc/DVABatch), behind Triton's batcher"),
    Variant("zerobatch-x2", {"name": "zerobatch"}, {"instances": 2}, doc="ZeroBatch, two model instances",
            whole=True),
    Variant("delaybatch-x2", _DELAY, {"instances": 2}, doc="DelayBatch, two model instances", whole=True),
    Variant("dvabatch-window", {"name": "dvabatch", "max_queue_delay_ms": WINDOW},
            doc="DVABatch behind DelayBatch's tuned window"),
    Variant("dva-multientry", {"name": "dvabatch", "policies": []},
            doc="multi-entry pipelining only: no stretch, split or clustering"),
    Variant("dva+stretch", {"name": "dvabatch", "policies": ["load"]}, doc="+ Policy III (stretch)"),
    Variant("dva+split", {"name": "dvabatch", "policies": ["load", "operator"]}, doc="+ Policy II (split)"),
    Variant("dva+input", {"name": "dvabatch", "policies": ["load", "operator", "input"]}, token_only=True,
            doc="+ Policy I (input clustering), token models only"),
)
# the papers' peer systems (each a policy of its own name, with its paper's defaults): runnable by
# ``dvasim compare --policies``, not in the default set (which is the DVABatch paper's study)
PEER_VARIANTS: tuple[Variant, ...] = tuple(
    Variant(name, {"name": name}, doc=doc, study_batch_limit=False) for name, doc in (
        ("serial", "LazyBatching's Serial: no batching, one request at a time"),
        ("graphbatch", "LazyBatching's GraphB(5): a 5 ms window, batches up to 64"),
        ("lazybatch", "LazyBatching: node-level lazy batching under an SLA-aware slack predictor"),
        ("tfserving-nowait", "TF-Serving NO_Wait (E2bird): no batch timeout, batches up to 32"),
        ("tfserving-optwait", "TF-Serving OPT_Wait (E2bird): a 30 ms batch timeout, batches up to 32"),
        ("tfserving-static", "TF-Serving Static (E2bird): OPT_Wait with every batch padded to 32"),
        ("n-ebird", "E2bird's N-Ebird: elastic batches on multi-granularity workers"),
        ("e-ebird", "E2bird's E-Ebird: N-Ebird with the worker set profiled per load"),
    )
)
ALL_VARIANTS: tuple[Variant, ...] = VARIANTS + PEER_VARIANTS
DEFAULT_LABELS: tuple[str, ...] = tuple(v.label for v in VARIANTS)  # what compare runs unless told
VARIANT_BY_LABEL = {v.label: v for v in ALL_VARIANTS}
# the cumulative ablation chain from DelayBatch to DVABatch: (share name, variant ending the step)
ATTRIBUTION_STEPS = (("multientry", "dva-multientry"), ("stretch", "dva+stretch"), ("split", "dva+split"),
                     ("input", "dva+input"), ("rest", "dvabatch"))


def is_token_model(model: str, device: str = "titanrtx", stages: int | None = None) -> bool:
    """Does the model's table have a sequence-length dimension (Policy I applies)?"""
    from dvasim.model.catalog import resolve_model

    spec = MODELS[model]
    table = resolve_model({"name": model, "device": device, "stages": stages or spec["stages"]}).table
    return table.seq_lens is not None


def variants_for(model: str, labels: Iterable[str] | None = None, device: str = "titanrtx") -> list[Variant]:
    """The variants (in :data:`VARIANTS` order) among ``labels`` (default: all) that apply to ``model``."""
    wanted = set(DEFAULT_LABELS) if labels is None else set(labels)
    unknown = wanted - set(VARIANT_BY_LABEL)
    if unknown:
        raise ValueError(f"unknown variant {sorted(unknown)[0]!r}; allowed: {', '.join(VARIANT_BY_LABEL)}")
    token = None
    out = []
    for v in ALL_VARIANTS:
        if v.label not in wanted:
            continue
        if v.token_only:
            token = is_token_model(model, device) if token is None else token
            if not token:
                continue
        out.append(v)
    return out


def variant_config(variant: Variant | str, model: str, window: float, workload: dict[str, Any],
                   **cfg_kw) -> dict[str, Any]:
    """The config of ``variant`` on ``model`` (``window``: DelayBatch's tuned window) under ``workload``."""
    v = VARIANT_BY_LABEL[variant] if isinstance(variant, str) else variant
    engine = {**(cfg_kw.pop("engine", None) or {}), **v.engine}
    if v.whole:  # Triton's baselines: the model as one engine (their per-batch host work hides behind all of it)
        cfg_kw["stages"] = 1
    return make_config(model, v.policy_for(window), workload, engine=engine, study_batch_limit=v.study_batch_limit,
                       **cfg_kw)


def make_config(model: str, policy: dict[str, Any], workload: dict[str, Any], *, device: str = "titanrtx",
                stages: int | None = None, buffer_pairs: int = 2, qos_ms: float = QOS_MS,
                seq_len_dist: str | None = None, engine: dict[str, Any] | None = None,
                study_batch_limit: bool = True, stack: str | None = None,
                engine_file: str | None = None) -> dict[str, Any]:
    """A study run's config. ``stack``: the serving stack by name (``[server] stack``; default: the one the
    table implies); ``engine_file``: an engine file from ``dvasim fit`` merged over ``[engine]``."""
    spec = MODELS[model]
    wl = dict(workload)
    dist = seq_len_dist or spec.get("seq_len_dist")
    if dist and wl.get("kind") != "explicit":
        wl["seq_len_dist"] = dist
    cfg = {
        "model": {"name": model, "device": device, "stages": stages or spec["stages"]},
        "policy": {"max_batch_size": BS_MAX, **policy} if study_batch_limit else dict(policy),
        "workload": wl,
        "qos": {"target_ms": qos_ms},
        "engine": {"buffer_pairs": buffer_pairs, "progress": False, **(engine or {})},
    }
    if stack is not None:
        cfg["server"] = {"stack": stack}
    if engine_file is not None:
        from dvasim.config import apply_engine_file

        cfg = apply_engine_file(cfg, engine_file)
    return cfg


def run_config(cfg: dict[str, Any]):
    from dvasim.api import run_whole as run

    return run(cfg, progress=False)


# ----------------------------------------------------------------------------- peak throughput
def level_stats(df: pd.DataFrame, rates: np.ndarray, qos_ms: float = QOS_MS, pct: float = 99.0) -> pd.DataFrame:
    """Latency per offered-rate level of a stepping run (unfinished queries count as infinitely late): one row per
    level, as :func:`dvasim.reporting.stability.level_stats` (the ``levels`` of a stepping run's summary); throughput and
    the stability verdict too when ``df`` has ``arrival_ms`` and ``finish_ms``."""
    from dvasim.reporting import stability

    timed = "arrival_ms" in df and "finish_ms" in df
    return pd.DataFrame(stability.level_stats(
        df["latency_ms"].to_numpy(), np.asarray(rates), qos_ms, pct,
        arrival=df["arrival_ms"].to_numpy() if timed else None, finish=df["finish_ms"].to_numpy() if timed else None))


def stepping_bracket(levels: pd.DataFrame) -> tuple[float, float]:
    """(highest rate that, with all lower levels, stays within QoS; the next level's rate (inf if none))."""
    ok = levels["within_qos"].to_numpy()
    rates = levels["offered_qps"].to_numpy()
    k = 0
    while k < len(ok) and ok[k]:
        k += 1
    lo = float(rates[k - 1]) if k > 0 else 0.0
    hi = float(rates[k]) if k < len(rates) else math.inf
    return lo, hi


@dataclass
class PeakResult:
    peak_qps: float
    bracket: tuple[float, float]
    levels: pd.DataFrame
    stepping: pd.DataFrame  # per-query records of the stepping run, with the offered rate
    probes: list[tuple[float, float, bool]]  # (rate, p99, within) of the bisection


def peak_throughput(model: str, policy: dict[str, Any], *, seed: int = 0, refine: int = 4,
                    refine_queries: int = 4000, qos_ms: float = QOS_MS, **cfg_kw) -> PeakResult:
    from dvasim.workload import stepping_rates

    wl = {"kind": "stepping", "seed": seed, **STEPPING}
    res = run_config(make_config(model, policy, wl, qos_ms=qos_ms, **cfg_kw))
    rates = stepping_rates(**STEPPING)
    df = res.queries.assign(offered_qps=rates)
    levels = level_stats(df, rates, qos_ms)
    lo, hi = stepping_bracket(levels)
    probes = []
    if math.isfinite(hi):
        for k in range(refine):
            mid = math.sqrt(max(lo, 1.0) * hi) if lo > 0 else hi / 2
            wl = {"kind": "poisson", "rate_qps": mid, "n_queries": refine_queries, "seed": seed + 1 + k}
            r = run_config(make_config(model, policy, wl, qos_ms=qos_ms, **cfg_kw))
            lat = r.queries["latency_ms"].fillna(np.inf).to_numpy()
            p99 = float(np.percentile(lat, 99))
            ok = p99 <= qos_ms
            probes.append((mid, p99, ok))
            lo, hi = (mid, hi) if ok else (lo, mid)
    return PeakResult(lo, (lo, hi), levels, df, probes)


def latency_at_bs1(model: str, device: str = "titanrtx", stages: int | None = None) -> float:
    from dvasim.model.catalog import resolve_model

    spec = MODELS[model]
    table = resolve_model({"name": model, "device": device, "stages": stages or spec["stages"]}).table
    seq = None
    if table.seq_lens is not None:
        from dvasim.workload import load_lengths

        seq = int(np.median(load_lengths(spec.get("seq_len_dist", "glue:RTE"))))
    return table.total(1, seq)


def window_candidates(model: str, device: str = "titanrtx") -> list[float]:
    t1 = latency_at_bs1(model, device)
    return [round(t1 * f, 3) for f in (0.5, 1, 2, 4, 8, 16)]


def peak_by_capacity(model: str, policy: dict[str, Any], *, seed: int = 0, refine: int = 4, qos_ms: float = QOS_MS,
                     **cfg_kw) -> tuple[float, tuple[float, float]]:
    """The peak as :func:`dvasim.studies.capacity.capacity` finds it (Poisson load, p99 within ``qos_ms``, each probe
    decided with 95% confidence): ``(capacity_qps, bracket)``, the bracket's top ``inf`` when never exceeded.
    ``refine`` sets the effort: 4 and more, 2% resolution and the search's default probes; less, 5% and 2 s probes
    of at most 8,000 queries."""
    cfg = make_config(model, policy, {"kind": "poisson", "rate_qps": 100.0, "n_queries": 1000, "seed": seed},
                      qos_ms=qos_ms, **cfg_kw)
    return capacity_of(cfg, qos_ms, full=refine >= 4)


def capacity_of(cfg: dict[str, Any], qos_ms: float = QOS_MS, *, full: bool = True) -> tuple[float, tuple[float, float]]:
    """``cfg``'s capacity under a p99 of ``qos_ms`` (:func:`dvasim.studies.capacity.capacity` on ``cfg``'s workload kind):
    ``(capacity_qps, bracket)``, the bracket's top ``inf`` when never exceeded. ``full``: 2% resolution and the
    search's default probes (60 s of arrivals, a backlog trigger) and its long-run confirmation (600 s); else 5%,
    probes of 2 s and at most 8,000 queries, no confirmation (less effort, a less trustworthy answer)."""
    from dvasim.studies.capacity import capacity

    quick = {} if full else {"max_queries": 8_000, "min_duration_s": 2.0, "confirm_factor": 0}  # less effort
    res = capacity(cfg, qos_ms, resolution=0.02 if full else 0.05, **quick)
    lo, hi = res["bracket_qps"]
    return res["capacity_qps"], (lo, hi if hi is not None else math.inf)


def _peak_job(args):
    model, policy, kw = args
    kw = dict(kw)
    if kw.pop("peak", "stepping") == "capacity":
        return peak_by_capacity(model, policy, **kw)
    p = peak_throughput(model, policy, **kw)
    return p.peak_qps, p.bracket


def tune_delaybatch(model: str, windows: Iterable[float] | None = None, workers: int = 1, refine: int = 2,
                    **kw) -> pd.DataFrame:
    """Peak throughput of DelayBatch for each window; the chosen row has ``best = True``."""
    windows = list(windows) if windows is not None else window_candidates(model, kw.get("device", "titanrtx"))
    results = _map(_peak_job, [_window_job(model, w, refine, kw) for w in windows], workers)
    return _windows_frame(model, windows, [r[0] for r in results])


def _window_job(model: str, window: float, refine: int, kw: dict[str, Any]):
    return model, {"name": "delaybatch", "max_queue_delay_ms": window}, {**kw, "refine": refine}


def _windows_frame(model: str, windows: list[float], peaks: list[float]) -> pd.DataFrame:
    """The windows tried and DelayBatch's peak with each; ``best``: the highest peak (ties: the smaller window)."""
    df = pd.DataFrame({"model": model, "max_queue_delay_ms": windows, "peak_qps": peaks})
    best = df.sort_values(["peak_qps", "max_queue_delay_ms"], ascending=[False, True]).index[0]
    df["best"] = df.index == best
    return df


def _map(fn, jobs, workers):
    """``fn`` over ``jobs`` in order, on at most ``workers`` processes (never more than there are jobs)."""
    out: list[Any] = [None] * len(jobs)
    pool = _Jobs(workers, len(jobs))
    for i, job in enumerate(jobs):
        pool.submit(fn, job, partial(out.__setitem__, i))
    pool.run()
    return out


class _Jobs:
    """Jobs on at most ``workers`` processes (in this process with one), each with what to do with its result
    (``then``): a job that a result makes possible is submitted at once, so no worker waits for a phase of the study
    to end while another finishes it. Results do not depend on the order jobs finish in: every job is seeded."""

    def __init__(self, workers: int, n_jobs: int):
        workers = min(workers, n_jobs)  # never more processes than jobs
        from dvasim.studies.parallel import worker_leaves_signals

        # the workers leave Ctrl-C to this process, which ends them at once (run); SIGTERM ends a worker
        self.pool = (ProcessPoolExecutor(max_workers=workers, initializer=worker_leaves_signals)
                     if workers > 1 else None)
        self.waiting: dict[Future, Callable[[Any], None]] = {}

    def submit(self, fn: Callable[[Any], Any], arg: Any, then: Callable[[Any], None]) -> None:
        if self.pool is None:
            then(fn(arg))
        else:
            self.waiting[self.pool.submit(fn, arg)] = then

    def run(self) -> None:
        """Until every job (and every job their results submitted) is done; the first error is raised."""
        try:
            while self.waiting:
                done, _ = wait(list(self.waiting), return_when=FIRST_COMPLETED)
                for fut in sorted(done, key=list(self.waiting).index):  # (in the order they were submitted)
                    self.waiting.pop(fut)(fut.result())
        except BaseException:  # a failed job, Ctrl-C or SIGTERM: cancel what has not started, end what runs now
            from dvasim.studies.parallel import stop_pool

            stop_pool(self.pool)
            raise
        finally:
            if self.pool is not None:
                self.pool.shutdown(cancel_futures=True)


# ----------------------------------------------------------------------------- comparison (Figures 14 and 16)
def _run_job(args):
    model, label, window, load, rate, n_queries, seed, kw = args
    wl = {"kind": "poisson", "rate_qps": rate, "n_queries": n_queries, "seed": seed}
    r = run_config(variant_config(label, model, window, wl, **kw))
    s = r.summary
    pol = r.config["policy"]
    return {"model": model, "load": load, "offered_qps": rate, "policy": label, "policy_name": pol["name"],
            "stack": s["stack"],
            "dva_policies": "+".join(pol["policies"]) if "policies" in pol else "",
            "instances": s["instances"],
            "mean_latency_ms": s["mean_latency_ms"], "p99_latency_ms": s["p99_latency_ms"],
            "throughput_qps": s["throughput_qps"], "qos_violation_rate": s["qos_violation_rate"],
            "mean_exit_batch_size": s["mean_exit_batch_size"], "n_stretch": s["n_stretch"],
            "n_stretch_started": s["n_stretch_started"], "n_split": s["n_split"],
            "mean_batches_in_flight": s["mean_batches_in_flight"],
            "n_completed": s["n_completed"], "n_queries": s["n_queries"]}


def compare(models: Iterable[str] = tuple(MODELS), *, n_queries: int = 5000, seed: int = 1, workers: int = 2,
            progress: bool = True, windows: dict[str, float] | None = None, device: str = "titanrtx",
            refine: int = 4, policies: Iterable[str] | None = None, qos_ms: float = QOS_MS,
            peak: str = "stepping", stack: str | None = None, engine_file: str | None = None, seeds: int = 1):
    """Tune DelayBatch, find its peak, then run every variant at low / medium / high load.

    ``policies``: the variant labels to run (default: all of :data:`VARIANTS`, the DVABatch study; the peer
    systems of :data:`PEER_VARIANTS` run when named; ``dva+input`` runs only on token
    models). Returns ``(results, calibration)``: one row per (model, load, variant) with ``policy`` = the variant's
    label, and one row per model with the tuned window and the peak throughputs (DVABatch's only when
    ``dvabatch`` is run). Results do not depend on ``workers``: every run is seeded and rows keep job order.
    ``qos_ms``: the latency SLO the peaks are found under (and the QoS violation rates counted against). A peak
    that is the top of the stepping ladder (every level met the SLO) is only a lower bound: the calibration's
    ``attrs["peak_at_ladder_top"]`` lists them (model:policy), and ``dvasim compare`` warns. ``peak =
    "capacity"`` finds every peak (the window tuning's too) with :func:`peak_by_capacity` instead of the paper's
    stepping load and bisection. ``stack`` / ``engine_file``: every run's serving stack (see :func:`make_config`).
    ``seeds``: every (model, load, variant) run repeated with seeds ``seed .. seed + seeds - 1`` and the rows
    combined by :func:`over_seeds_rows` (one seed: the rows as they always were); the peaks and the tuned windows
    are found once, so every seed runs at the same offered loads."""
    models = list(models)
    labels = list(DEFAULT_LABELS) if policies is None else list(policies)
    per_model = {m: variants_for(m, labels, device) for m in models}
    want_dva_peak = tuple(p for p in DVA_SYSTEMS if p in labels)  # the DVABatch systems whose peaks are found
    total = sum(1 + 1 + len(want_dva_peak) + 3 * len(per_model[m]) * seeds for m in models)
    bar = progress_bar(total, enabled=progress, desc="compare", unit="step")  # drawn only on a terminal
    if peak not in ("stepping", "capacity"):
        raise ValueError(f"peak must be 'stepping' or 'capacity', got {peak!r}")
    kw = {"device": device} if qos_ms == QOS_MS else {"device": device, "qos_ms": float(qos_ms)}
    kw.update({k: v for k, v in (("stack", stack), ("engine_file", engine_file)) if v is not None})
    delay_kw = {"stages": 1} if VARIANT_BY_LABEL["delaybatch"].whole else {}  # its tuning and peak as it runs
    peak_kw = {**kw, "peak": peak} if peak != "stepping" else kw
    study = _CompareJobs(models, per_model, windows or {}, want_dva_peak, bar, peak_kw=peak_kw, delay_kw=delay_kw,
                         refine=refine, run_kw=kw, n_queries=n_queries, seed=seed, seeds=seeds)
    study.run(workers)
    bar.close()
    rows = study.rows()
    return (pd.DataFrame(rows) if seeds == 1 else over_seeds_rows(rows, [seed + k for k in range(seeds)])), \
        study.calibration()


class _CompareJobs:
    """:func:`compare`'s runs as jobs, each submitted as soon as what it needs is known: a model's window tuning
    (DelayBatch's peak with each candidate window), then DelayBatch's peak with the tuned window, then the model's
    runs at the three loads (fractions of that peak); DVABatch's peaks need nothing. Rows keep the job order."""

    def __init__(self, models, per_model, windows, want_dva_peak, bar, *, peak_kw, delay_kw, refine, run_kw,
                 n_queries, seed, seeds):
        self.models, self.per_model, self.want_dva_peak, self.bar = models, per_model, want_dva_peak, bar
        self.peak_kw, self.delay_kw, self.refine, self.run_kw = peak_kw, delay_kw, refine, run_kw
        self.n_queries, self.seed, self.seeds = n_queries, seed, seeds
        self.window = {m: float(windows[m]) for m in models if m in windows}  # DelayBatch's, given or tuned
        self.tried: dict[str, dict[float, float]] = {m: {} for m in models}  # model -> window -> peak
        self.peak: dict[tuple[str, str], tuple[float, tuple[float, float]]] = {}  # (model, policy) -> found
        self.first_run, n = {}, 0  # each model's runs: from this index, in (load, variant, seed) order
        for m in models:
            self.first_run[m], n = n, n + len(LOADS) * len(per_model[m]) * seeds
        self.results: list[dict[str, Any] | None] = [None] * n
        self.tune_kw = {**delay_kw, **peak_kw}
        self.candidates = {m: window_candidates(m, self.tune_kw.get("device", "titanrtx"))
                           for m in models if m not in self.window}
        self.n_jobs = sum(map(len, self.candidates.values())) + len(models) * (1 + len(want_dva_peak)) + n
        self.jobs: Any = None  # the _Jobs while the study runs

    def run(self, workers: int) -> None:
        self.jobs = _Jobs(workers, self.n_jobs)
        for m in self.models:
            if m in self.window:
                self.bar.update(1)
                self._peak_of_delaybatch(m)
            else:
                windows = self.candidates[m]
                for w in windows:
                    job = _window_job(m, w, 2, self.tune_kw)
                    self.jobs.submit(_peak_job, job, partial(self._tried, m, windows, w))
            for system in self.want_dva_peak:
                self.jobs.submit(_peak_job, (m, {"name": system}, {**self.peak_kw, "refine": self.refine}),
                                 partial(self._peaked, m, system))
        self.jobs.run()

    def _tried(self, model: str, windows: list[float], window: float, found) -> None:
        self.tried[model][window] = found[0]
        if len(self.tried[model]) < len(windows):
            return
        tuned = _windows_frame(model, windows, [self.tried[model][w] for w in windows])
        self.window[model] = float(tuned.loc[tuned["best"], "max_queue_delay_ms"].iloc[0])
        self.bar.update(1)
        self._peak_of_delaybatch(model)

    def _peak_of_delaybatch(self, model: str) -> None:
        job = (model, {"name": "delaybatch", "max_queue_delay_ms": self.window[model]},
               {**self.peak_kw, "refine": self.refine, **self.delay_kw})
        self.jobs.submit(_peak_job, job, partial(self._peaked, model, "delaybatch"))

    def _peaked(self, model: str, policy: str, found) -> None:
        self.peak[(model, policy)] = found
        self.bar.update(1)
        if policy != "delaybatch":
            return
        if found[0] <= 0:  # no load met the SLO: the runs at fractions of the peak would have no load at all
            from dvasim.errors import ConfigError

            slo = self.peak_kw.get("qos_ms", QOS_MS)
            raise ConfigError("--slo-ms", f"no load of {model} met a p99 within {slo:g} ms under DelayBatch (its peak "
                                          "search found 0 QPS); give a larger SLO")
        i = self.first_run[model]
        for load, frac in LOADS.items():
            rate = frac * found[0]
            for v in self.per_model[model]:
                for k in range(self.seeds):
                    job = (model, v.label, self.window[model], load, rate, self.n_queries, self.seed + k, self.run_kw)
                    self.jobs.submit(_run_job, job, partial(self._ran, i))
                    i += 1

    def _ran(self, i: int, row: dict[str, Any]) -> None:
        self.results[i] = row
        self.bar.update(1)

    def rows(self) -> list[dict[str, Any]]:
        return list(self.results)

    def calibration(self) -> pd.DataFrame:
        """One row per model: the tuned window and the peaks; ``attrs["peak_at_ladder_top"]``: the peaks that are
        the top of the stepping ladder (only lower bounds), as model:policy."""
        calib, at_top = [], []
        stages = self.delay_kw.get("stages")
        for m in self.models:
            peak_delay = self.peak[(m, "delaybatch")][0]
            peak_dva = self.peak[(m, "dvabatch")][0] if "dvabatch" in self.want_dva_peak else math.nan
            row = {"model": m, "stages": MODELS[m]["stages"], "baseline_stages": stages or MODELS[m]["stages"],
                   "delaybatch_window_ms": self.window[m],
                   "peak_qps_delaybatch": peak_delay, "peak_qps_dvabatch": peak_dva,
                   "peak_gain_%": 100.0 * (peak_dva / peak_delay - 1.0)}
            if "dvabatch-built" in self.want_dva_peak:  # (columns only when run: the default study's are as before)
                built = self.peak[(m, "dvabatch-built")][0]
                row.update({"peak_qps_dvabatch-built": built, "peak_gain_built_%": 100.0 * (built / peak_delay - 1.0)})
            calib.append(row)
            for pol in ("delaybatch", *self.want_dva_peak):
                if not math.isfinite(self.peak[(m, pol)][1][1]):
                    at_top.append(f"{m}:{pol}")
        df = pd.DataFrame(calib)
        df.attrs["peak_at_ladder_top"] = at_top
        return df


INTERVAL_METRICS = ("mean_latency_ms", "p99_latency_ms")  # the metrics compare.csv gives an interval


def over_seeds_rows(rows: list[dict[str, Any]], seeds: list[int], confidence: float = 0.95) -> pd.DataFrame:
    """The runs of every (model, load, variant) over ``seeds`` (``rows``: one per run, seeds innermost) as one row:
    each number the mean over the seeds, ``n_seeds``, and after the mean and p99 latency their Student-t interval
    over the seeds (``<metric>_lo``, ``<metric>_hi``: :func:`dvasim.reporting.intervals.over_seeds`). The rows of
    every seed are kept in ``attrs["by_seed"]`` (records, each with its ``seed``)."""
    from dvasim.reporting.intervals import over_seeds

    k = len(seeds)
    if len(rows) % k:
        raise ValueError(f"{len(rows)} runs are not {k} seeds of each comparison")
    out = []
    for i in range(0, len(rows), k):
        group = rows[i:i + k]
        row: dict[str, Any] = {}
        for col, first in group[0].items():
            vals = [g.get(col) for g in group]
            numbers = all(isinstance(v, int | float | np.number) and not isinstance(v, bool) for v in vals)
            if col in INTERVAL_METRICS and numbers:
                iv = over_seeds(vals, confidence)
                row[col], row[f"{col}_lo"], row[f"{col}_hi"] = iv.point, iv.lo, iv.hi
            elif all(v == first for v in vals):  # the same in every seed (a label, an int): kept as it is
                row[col] = first
            elif numbers:
                row[col] = float(np.mean(vals))
            else:
                row[col] = "/".join(map(str, dict.fromkeys(vals)))
        row["n_seeds"] = k
        out.append(row)
    df = pd.DataFrame(out)
    df.attrs["by_seed"] = [{**r, "seed": seeds[j % k]} for j, r in enumerate(rows)]
    return df


def reductions(results: pd.DataFrame, metric: str = "mean_latency_ms", system: str = "dvabatch") -> pd.DataFrame:
    """DVABatch's (``system``: ``dvabatch``, or ``dvabatch-built``) reduction of ``metric`` against each baseline,
    per model and load (positive = better; NaN where a policy was not run)."""
    piv = results.pivot_table(index=["model", "load"], columns="policy", values=metric)
    out = pd.DataFrame(index=piv.index)
    dva = piv[system] if system in piv.columns else math.nan
    for base in ("zerobatch", "delaybatch"):
        out[f"vs_{base}_%"] = 100.0 * (1.0 - dva / piv[base]) if base in piv.columns else math.nan
    if f"{metric}_lo" in results.columns:  # runs over several seeds: each reduction's interval and its tie
        _reduction_intervals(results, metric, out, system)
    return out.reset_index()


def _reduction_intervals(results: pd.DataFrame, metric: str, out: pd.DataFrame, system: str = "dvabatch") -> None:
    """``vs_<base>_%_lo`` / ``_hi`` (DVABatch's reduction's interval: the two intervals' half-widths in quadrature,
    :func:`dvasim.reporting.intervals.relative_difference`) and ``vs_<base>_tie`` (the difference within it,
    :func:`dvasim.reporting.intervals.tie`), per (model, load) of ``out``, in place."""
    from dvasim.reporting.intervals import Interval, relative_difference, tie

    ivs = {}
    for r in results.to_dict("records"):
        n = int(r.get("n_seeds", 1))
        ivs[(r["model"], r["load"], r["policy"])] = Interval(float(r[metric]), float(r[f"{metric}_lo"]),
                                                              float(r[f"{metric}_hi"]), n, 0.95, "t over seeds")
    for base in ("zerobatch", "delaybatch"):
        cells = []  # (lo, hi, tie) of each (model, load)
        for model, load in out.index:
            a, b = ivs.get((model, load, system)), ivs.get((model, load, base))
            if a is None or b is None:
                cells.append((math.nan, math.nan, math.nan))
                continue
            d = relative_difference(a, b)  # (dva - base) / base: the reduction is its negative
            cells.append((-d.hi, -d.lo, tie(a, b)))
        for j, name in enumerate((f"vs_{base}_%_lo", f"vs_{base}_%_hi", f"vs_{base}_tie")):
            out[name] = [c[j] for c in cells]


def attribution(results: pd.DataFrame, metric: str = "mean_latency_ms",
                tolerance: float = MATCH_TOLERANCE) -> pd.DataFrame:
    """Where DVABatch's reduction of ``metric`` against DelayBatch comes from, per model and load.

    ``reduction_%`` = ``100 (1 - dvabatch / delaybatch)``; it is split along the cumulative ablation chain
    delaybatch -> dva-multientry -> dva+stretch -> dva+split [-> dva+input] -> dvabatch into shares in percentage
    points of DelayBatch's ``metric``: ``share_X_pp = 100 (before - after) / delaybatch`` for each step, so the
    shares add up to ``reduction_%`` (a telescoping sum). ``share_input_pp`` is NaN on models without a
    ``dva+input`` run (no sequence length): there ``share_rest_pp`` starts from ``dva+split``. ``rest`` is what
    DVABatch's own configuration adds over the last ablation: its choice of policies (§7.1) and Policy I's window.
    A share is NaN when one of its ends was not run.

    Also Triton with two instances: its ``metric`` (``zerobatch-x2_<metric>``, ``delaybatch-x2_<metric>``),
    DVABatch's reduction against it (``vs_zerobatch-x2_%``, ``vs_delaybatch-x2_%``) and flags where that baseline's ``metric`` is within ``tolerance`` of DVABatch's or below it
    (``zerobatch-x2_matches``, ``delaybatch-x2_matches``; ``x2_matches_or_beats``: either)."""
    piv = results.pivot_table(index=["model", "load"], columns="policy", values=metric)
    nan = pd.Series(math.nan, index=piv.index)

    def col(label):
        return piv[label] if label in piv.columns else nan

    base, dva = col("delaybatch"), col("dvabatch")
    out = pd.DataFrame(index=piv.index)
    out[f"delaybatch_{metric}"] = base
    out[f"dvabatch_{metric}"] = dva
    out["reduction_%"] = 100.0 * (base - dva) / base
    prev = base
    for share, label in ATTRIBUTION_STEPS:
        cur = col(label)
        if share == "input":
            # models without a dva+input run skip the step: the chain goes on from dva+split
            out[f"share_{share}_pp"] = 100.0 * (prev - cur) / base
            prev = cur.where(cur.notna(), prev)
        else:
            out[f"share_{share}_pp"] = 100.0 * (prev - cur) / base
            prev = cur
    for x2 in ("zerobatch-x2", "delaybatch-x2"):
        other = col(x2)
        out[f"{x2}_{metric}"] = other
        out[f"vs_{x2}_%"] = 100.0 * (other - dva) / other
        out[f"{x2}_matches"] = (other <= dva * (1.0 + tolerance)) & other.notna() & dva.notna()
    out["x2_matches_or_beats"] = out["zerobatch-x2_matches"] | out["delaybatch-x2_matches"]
    out = out.reset_index()
    order = {k: i for i, k in enumerate(LOADS)}
    out = out.sort_values(["model", "load"], key=lambda c: c.map(order) if c.name == "load" else c)
    return out.reset_index(drop=True)


SHARE_COLUMNS = tuple(f"share_{s}_pp" for s, _ in ATTRIBUTION_STEPS)
SHARE_NAMES = plots.SHARE_NAMES  # short names of the attribution's steps, for tables and legends
