"""A GPU matrix in one command (issue 35, item 4): profile, replay, calibrate, fit on ZeroBatch, predict the rest.

    python3 experiments/validation/gpu_matrix.py --wheels .whl          # on a lent GPU (make gpu-matrix)
    .venv/bin/python experiments/validation/gpu_matrix.py --cpu --tiny  # the same on the CPU, tiny (CI; make gpu-matrix-cpu)
    .venv/bin/python experiments/validation/gpu_matrix.py --download-wheels .whl   # here, once (make gpu-wheels)
    .venv/bin/python experiments/validation/gpu_matrix.py --analyse --traces traces/gpu_matrix/h100_DATE

What it runs, in this order (the most valuable first, each step written as soon as it ends):

1. **profile**: each model's four stages as CUDA graphs, GPU time at every batch size 1..16 (BERT-base: lengths
   16, 32, 64, 128 and 192, which holds RTE's longest input, 176), and the host's launch cost of a graph
   (:func:`dvasim.fitting.validate.gpu_stage_table`): ``<model>_table.csv`` (+ ``.launch.csv``). The replays'
   policy decides with it, and the predictions simulate on it. After the model's graphs are captured, a
   saturation replay (ZeroBatch offered 3x the table's capacity: :func:`measure_capacity`) measures its capacity;
   the loads are 0.3, 0.6 and 0.85 of that (the table's GPU time alone overstated it 1.8-2x on the H200).
2. **ZeroBatch replays** of ResNet152, BERT-base (GLUE RTE lengths) and VGG19 at the three loads, twice
   (:func:`dvasim.engines.replay.replay`, ``[replay] modules = "cudagraph"``, one stream per stage executor, max
   batch 16, 2 buffer pairs, Poisson arrivals, seed 7, ``--queries`` per replay). Cuts: ResNet152 0/39/78/118
   and BERT-base 0/15/31/47 (the earlier H100 replays' and co-runs', ``traces/gpu/h100/measured/
   stage_bounds.csv``), VGG19 0/7/13/19 (time-even on the h100 table; stage_bounds.csv's 0/12/21/22 leaves
   stages of 0.16 and 0.04 ms).
3. **overlap calibration**: four threads, each replaying one stage's CUDA graph on its own stream and
   synchronising after every call, against each stage alone, 100 calls each (the experiment of
   ``traces/gpu/h100/measured/overlap_4threads.csv``): BERT-base at batch 1 (length 64), ResNet152 and VGG19
   at batches 1 and 8, and the same with TorchScript stages (host-bound launches: BERT-base and ResNet152 at
   batch 1, ResNet152 at 8; each stage's time alone kept, ``alone_ms_by_stage``). ``overlap_4threads.csv``.
4. **DelayBatch and DVABatch replays**, one repeat of every case, then the second repeats. DelayBatch's window
   is the model's batch-1 latency in the table; DVABatch runs the parameters of the earlier H100 replays
   (:func:`dvasim.fitting.check.recorded_dvabatch`), written into each config so that the replay and the
   prediction run the same policy.
5. **fit and predict** (CPU only; ``--analyse`` reruns it alone on a traces folder): ``dvasim fit`` on the
   ZeroBatch replays (:func:`dvasim.fitting.fit.fit`, with intervals), ``contention = "overlap"`` with the share
   fitted on the batch-1 CUDA-graph co-runs (:func:`dvasim.studies.contention.fit_share`; the batch-8 co-runs
   held out), the host's launching cores on the TorchScript ones (:func:`host_calibration`, for engines of
   TorchScript stages),
   then every case simulated with its first replay's config on the table and the fitted engine
   (:func:`dvasim.fitting.check.score_case`) against the mean of its replays: ZeroBatch in-sample ("fit"),
   DelayBatch and DVABatch predicted. Also without contention (``none_err_*``) and with the default GPU-only
   engine (``before_*``).

Time: sized for about 8 minutes of one H100 in one device call. Measuring stops starting new steps when
``--budget-s`` (default 420 s) is spent or a step's estimate would overrun it; a replay is stopped (and marked
``interrupted``, not scored) at three times its planned length plus 30 s. Everything finished is written, the
summary made from it, and what was skipped is listed in ``progress.jsonl``, the traces' ``README.md`` and
``summary.json``. Measured on an H200 (2026-11-28) with 1,000 queries a replay: profiles 9-13 s (BERT-base 21 s),
graph captures 0.3-2.4 s (once per model: :func:`dvasim.engines.replay.engine.reused_graphs`), a replay 0.8-1.9 s,
a co-run 0.3-1 s, fit and prediction 21 s (100 s for two models and their 36 replays; a full run of three
models with saturation replays is not yet measured). A rerun
on a folder resumes: finished replays, tables and co-runs are kept.

Hangs: on CUDA (or with ``--supervise``) the matrix measures in a child process, this script again. Each step
writes ``current_step.json`` with its deadline (profile 240 s, capture 120 s, co-run 90 s, replay three times its
planned length plus 45 s; ``--step-limit-s`` caps them all); a step past it has the child killed, is recorded
``hung`` with its model, and a new child resumes the matrix with that model's GPU steps skipped (at most four
children; a child that dies in a step is treated alike, ``died``). Measured on the first GPU run (an H200,
``traces/gpu_matrix/h200_2026-11-28/DEVICE_CALLS.md``): BERT-base's first replay blocked in its warm-up's
synchronisations for the rest of the device call, 540 s, because the replay's own time limit is asked between
warm-up passes only. The replay now also gives up on a blocked warm-up itself (``ReplayEngine.warm_grace_s``: at
three times its planned length plus 35 s); that step is recorded ``hung`` and the child ends (status 75) for a
fresh process to resume, since a device that did not return cannot be trusted for the next replay in the same
CUDA context. ``--no-supervise`` measures in this process (the model skipped after a hang there too).

Outputs: ``traces/gpu_matrix/<gpu>_<date>/`` (``README.md`` and ``environment.json`` with GPU, driver, torch,
CUDA, cuDNN, Python and date; the tables, ``overlap_4threads.csv``, ``<model>_summary.json`` and per replay
``<model>_<policy>_<load>/r<k>/`` with ``config.toml``, ``queries.csv.gz``, ``executions.csv.gz``,
``summary.json``, ``config.json``; ``progress.jsonl``, ``run.log``), and ``experiments/validation/gpu/``
(``summary.csv``, ``summary.json``, ``summary.md``, ``calibration.csv``, the fitted ``engine_<model>.toml``).
With ``--cpu`` or ``--tiny`` both go under ``results/gpu_matrix/`` (not committed) unless given. Where ``$OUT``
is set (the device tool) or ``--out`` given, everything is packed into one ``gpu_matrix_<tag>.tar.gz`` there
(unpack at the repository root), refreshed every 30 s and at the end, with ``summary.md`` and ``run.log`` beside
it (the device tool brings back what is under ``$OUT`` even from a command stopped at its limit).

On the device tool, after ``make gpu-wheels`` here: :data:`DEVICE_COMMAND`, i.e. ``run(command="PYTHONUNBUFFERED=1
python3 experiments/validation/gpu_matrix.py --wheels .whl", carry=[".whl"], timeout_s=600)`` (``make gpu-matrix``
is the same where the image has make). The device's
image has torch, numpy, pandas, scipy, matplotlib, pyarrow and protobuf, not simpy (the simulator's event loop):
``--wheels DIR`` installs from DIR only what is missing, into a temporary folder, and restarts itself with it on
the path. MLPerf LoadGen is not needed: the replays are driven by the replay's own front door.

``--cpu --tiny``: the small VGG19 and BERT-base in two stages, batches up to 4, 12 queries a replay, two loads,
threads on the CPU and the CPU stand-in graphs (:class:`dvasim.model.stages.graphs.CpuGraphs`), co-runs of 10
calls: the whole chain in seconds (``tests/experiments/test_gpu_matrix.py``). Its numbers mean nothing.
Bad flags print one line naming the flag and exit with status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
if importlib.util.find_spec("dvasim") is None:  # run as a file from a checkout (the device machine installs nothing)
    sys.path.insert(0, str(ROOT))

MODELS = ("resnet152", "bert_base", "vgg19")
POLICIES = ("zerobatch", "delaybatch", "dvabatch")
LOADS = (0.3, 0.6, 0.85)
# the cuts of the GPU matrix (first operator of each stage; see the module docstring)
CUTS = {"resnet152": [0, 39, 78, 118], "bert_base": [0, 15, 31, 47], "vgg19": [0, 7, 13, 19]}
BERT_LENGTHS = (16, 32, 64, 128, 192, 256)  # the profiled lengths (the replays' graph buckets) of token models
# the co-runs: (model, batch size, length, modules). CUDA graphs: batch 1 calibrates the device's contention share,
# the others are held out. TorchScript (host-bound launches): the host path's contention, as the launching cores
# (dvasim.studies.contention.fit_host_cores); the H100 diagnostics left these blank (their alone runs included the
# first calls' specialisation: these warm up first)
CO_RUNS = (("bert_base", 1, 64, "cudagraph"), ("resnet152", 1, None, "cudagraph"), ("resnet152", 8, None, "cudagraph"),
           ("vgg19", 1, None, "cudagraph"), ("vgg19", 8, None, "cudagraph"),
           ("bert_base", 1, 64, "torchscript"), ("resnet152", 1, None, "torchscript"),
           ("resnet152", 8, None, "torchscript"))
# what the device machine's image lacks (/work/.library/device/KINDS.md): pip name, import name
WHEELS = (("simpy==4.1.2", "simpy"),)
DEVICE_COMMAND = ('run(command="PYTHONUNBUFFERED=1 python3 experiments/validation/gpu_matrix.py --wheels .whl", '
                  'carry=[".whl"], timeout_s=600)')
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
TARGETS = {"mean_latency_ms": 0.15, "p99_latency_ms": 0.25, "throughput_qps": 0.05}  # the targets
TIGHT = {"mean_latency_ms": 0.05, "p99_latency_ms": 0.10, "throughput_qps": 0.03}  # and the run-to-run floor
METRICS = tuple(TARGETS)
SEED = 7
QOS_MS = 200.0
REEXEC = "DVASIM_GPU_MATRIX_SITE"  # set when restarted with the installed wheels on the path
CHILD = "DVASIM_GPU_MATRIX_CHILD"  # set in the measuring child of :func:`supervise` (its number)
T0_UNIX = "DVASIM_GPU_MATRIX_T0"  # the supervisor's start (Unix time): the child's budget counts from it
HANG = "DVASIM_GPU_MATRIX_HANG"  # tests: the child blocks forever in the step of this name (a device hang)
STEP_FILE = "current_step.json"  # the child's step in progress, with its deadline (read by the supervisor)
STEP_LIMIT_S = {"profile": 240.0, "capture": 120.0, "co-run": 90.0}  # a replay: 3 x planned + 45 s
CHILDREN = 4  # measuring children started at most (one per hang, and the first)
HUNG_EXIT = 75  # a measuring child's status after it recorded a step whose stage calls did not return


class Usage(Exception):
    """A bad flag: one line naming it and the fix, exit status 2."""

    def __init__(self, field_: str, message: str):
        super().__init__(f"{field_}: {message}")


# ----------------------------------------------------------------------------- the plan
@dataclass
class Plan:
    device: str  # "cuda" or "cpu"
    tiny: bool
    models: tuple[str, ...]
    policies: tuple[str, ...]
    loads: tuple[float, ...]
    repeats: int
    n_queries: int
    budget_s: float
    bootstrap: int
    traces: Path
    summary: Path
    out: Path | None
    max_batch: int = 16
    co_runs: tuple = CO_RUNS
    calls: int = 100
    profile_repeats: int = 5
    profile_warmup: int = 2
    table_device: str = "h100"  # the [model] device whose table cuts the model (the policy uses the profile)
    cuts: dict[str, list[int]] = field(default_factory=dict)
    step_limit_s: float | None = None  # caps every step's hang limit (:func:`watch`)
    supervise: bool = False  # measure in a child process that a hang can be killed in (:func:`supervise`)
    t0: float = field(default_factory=time.monotonic)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return self.budget_s - self.elapsed()


def _list(text: str, allowed, flag: str, conv=str) -> tuple:
    try:
        vals = tuple(conv(x.strip()) for x in str(text).split(",") if x.strip())
    except ValueError:
        vals = ()
    bad = [v for v in vals if allowed is not None and v not in allowed]
    if not vals or bad:
        raise Usage(flag, f"must be a comma-separated list of {', '.join(map(str, allowed))}; got {text!r}")
    return tuple(dict.fromkeys(vals))


def _number(text, flag: str, lo: float, hi: float, conv=float, what: str = "a number"):
    try:
        v = conv(text)
    except (TypeError, ValueError):
        v = None
    if v is None or not math.isfinite(v) or not lo <= v <= hi:
        raise Usage(flag, f"must be {what} in {lo:g}..{hi:g}; got {text!r}")
    return v


def _loads(text: str) -> tuple[float, ...]:
    vals = []
    for x in str(text).split(","):
        if x.strip():
            vals.append(_number(x.strip(), "--loads", 0.01, 2.0, what="fractions of capacity"))
    if not vals:
        raise Usage("--loads", f"must be a comma-separated list of fractions of capacity, e.g. 0.3,0.6,0.85; got {text!r}")
    return tuple(dict.fromkeys(vals))


def parser() -> argparse.ArgumentParser:
    from dvasim.errors import OneLineParser

    p = OneLineParser(prog="gpu_matrix.py", description=__doc__.split("\n")[0])
    p.add_argument("--cpu", action="store_true", help="run on the CPU (threads, stand-in graphs, the small models)")
    p.add_argument("--tiny", action="store_true", help="a tiny matrix: seconds, for CI (numbers meaningless)")
    p.add_argument("--models", default=None, help=f"comma-separated, among {', '.join(MODELS)} (default: all)")
    p.add_argument("--policies", default=",".join(POLICIES), help="comma-separated (default: all three)")
    p.add_argument("--loads", default=None, help="fractions of capacity (default 0.3,0.6,0.85; tiny 0.3,0.85)")
    p.add_argument("--repeats", default="2", help="replays per case, 1..10 (default 2)")
    p.add_argument("--queries", default=None, help="queries per replay, 4..100000 (default 1000; tiny 12)")
    p.add_argument("--budget-s", default="420", help="seconds after which no new step starts (default 420)")
    p.add_argument("--bootstrap", default=None, help="the fit's resamples for intervals, 0..10000 (default 200; tiny 10)")
    p.add_argument("--traces", default=None, help="the traces folder (default traces/gpu_matrix/<gpu>_<date>)")
    p.add_argument("--summary", default=None, help="the summary folder (default experiments/validation/gpu)")
    p.add_argument("--out", default=os.environ.get("OUT") or None,
                   help="pack everything into one tar.gz here (default: $OUT, where set)")
    p.add_argument("--supervise", action="store_true",
                   help="measure in a child process, killed and restarted past a step's hang limit (default on CUDA)")
    p.add_argument("--no-supervise", action="store_true", help="measure in this process (a hang then waits forever)")
    p.add_argument("--step-limit-s", default=None,
                   help="the longest any one step may take before it counts as hung (default: per step kind)")
    p.add_argument("--analyse", action="store_true", help="only fit and predict from --traces (no torch, no GPU)")
    p.add_argument("--wheels", default=None, help="install what is missing from this folder of wheels first")
    p.add_argument("--download-wheels", default=None, metavar="DIR",
                   help="download the wheels the device machine lacks into DIR (here, with PyPI) and stop")
    return p


def make_plan(args) -> Plan:
    """Every flag checked (one :class:`Usage` naming the first bad one), the defaults of the mode filled in."""
    models = _list(args.models or ("vgg19,bert_base" if args.tiny else ",".join(MODELS)), MODELS, "--models")
    policies = _list(args.policies, POLICIES, "--policies")
    if "zerobatch" not in policies:
        raise Usage("--policies", "must include zerobatch (the fit is made on the ZeroBatch replays)")
    loads = _loads(args.loads or ("0.3,0.85" if args.tiny else ",".join(map(str, LOADS))))
    repeats = _number(args.repeats, "--repeats", 1, 10, int, "an integer")
    n = _number(args.queries or (12 if args.tiny else 1000), "--queries", 4, 100_000, int, "an integer")
    budget = _number(args.budget_s, "--budget-s", 1, 86_400, what="a number of seconds")
    boot = _number(args.bootstrap or (10 if args.tiny else 200), "--bootstrap", 0, 10_000, int, "an integer")
    device = "cpu" if args.cpu else "cuda"
    if args.analyse and args.traces is None:
        raise Usage("--traces", "--analyse needs the traces folder of a run, e.g. --traces traces/gpu_matrix/h100_DATE")
    for flag in ("traces", "summary", "out"):
        v = getattr(args, flag)
        if v is not None and Path(v).exists() and not Path(v).is_dir():
            raise Usage(f"--{flag}", f"{v!r} exists and is not a folder; give a folder")
    plan = Plan(device, bool(args.tiny), models, policies, loads, repeats, n, budget, boot, Path("."), Path("."),
                Path(args.out) if args.out else None)
    if args.tiny:
        plan.max_batch, plan.calls, plan.profile_repeats, plan.profile_warmup = 4, 10, 2, 1
        plan.co_runs = tuple((m, b, L, mod) for m in models for b, L in ((1, 16 if m == "bert_base" else None),
                                                                        (4, 16 if m == "bert_base" else None))
                             for mod in ("cudagraph", "torchscript") if mod == "cudagraph" or b == 1)
    if device == "cpu":
        plan.table_device = "cpu"
    if args.step_limit_s is not None:
        plan.step_limit_s = _number(args.step_limit_s, "--step-limit-s", 1, 86_400, what="a number of seconds")
    plan.supervise = (device == "cuda" or args.supervise) and not args.no_supervise and not args.analyse
    if os.environ.get(T0_UNIX):  # a supervisor's child: the budget counts from the supervisor's start
        plan.t0 = time.monotonic() - max(0.0, time.time() - float(os.environ[T0_UNIX]))
    _places(plan, args)
    return plan


def _places(plan: Plan, args) -> None:
    """Where the traces and the summary go (the module docstring), and the cut of every model."""
    from dvasim.model.catalog import resolve_model

    for m in plan.models:  # on the CPU the small variants, cut time-evenly on the CPU table
        plan.cuts[m] = (list(resolve_model({"name": m, "device": "cpu", "stages": 2}).bounds)
                        if plan.device == "cpu" else list(CUTS[m]))
    scratch = plan.device == "cpu" or plan.tiny  # not committed: under results/
    base = None
    if args.traces is None or (scratch and args.summary is None):
        tag = f"{device_tag(plan.device)}_{_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d}" + ("_tiny" if plan.tiny else "")
        base = ROOT / "results" / "gpu_matrix" / tag
        default_traces = base / "traces" if scratch else ROOT / "traces" / "gpu_matrix" / tag
    plan.traces = Path(args.traces) if args.traces is not None else default_traces
    plan.summary = Path(args.summary) if args.summary is not None else (base / "summary" if scratch else HERE / "gpu")


def device_tag(device: str) -> str:
    """``h100`` on an H100 (the name the tables use), else the GPU's name in lower-case letters and digits; ``cpu``."""
    if device != "cuda":
        return "cpu"
    import torch

    from dvasim.engines.replay.engine import gpu_table_name

    if not torch.cuda.is_available():
        return "cuda"
    name = torch.cuda.get_device_name()
    flat = "".join(ch for ch in name.lower() if ch.isalnum())
    return gpu_table_name(name) or next((w for w in ("h200", "b200", "l40s", "a10") if w in flat), flat[:24])


# ----------------------------------------------------------------------------- wheels
def download_wheels(folder: Path) -> int:
    """``pip download`` (here, where PyPI is reachable) of the wheels the device machine lacks, for its Python 3.12
    on x86-64, into ``folder`` (keep it out of git: .gitignore has /.whl/)."""
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", *[a for p in PLATFORMS for a in ("--platform", p)], "-d", str(folder),
           *[w for w, _ in WHEELS]]
    print(" ".join(cmd), flush=True)
    rc = subprocess.call(cmd)
    if rc == 0:
        print(f"wheels in {folder}; on a lent GPU, from the repository root: {DEVICE_COMMAND}")
    if rc != 0:
        print(f"gpu_matrix.py: error: --download-wheels: pip download failed (status {rc}); without PyPI, copy "
              f"{', '.join(w for w, _ in WHEELS)} (py3-none-any wheels) into {folder} by hand", file=sys.stderr)
        return 2
    return 0


def install_missing(folder: Path, argv: list[str]) -> None:
    """Install from ``folder`` the wheels of :data:`WHEELS` whose package this Python cannot import, into a
    temporary folder, and restart this script with it on the path; nothing to do when all are there."""
    missing = [(w, name) for w, name in WHEELS if importlib.util.find_spec(name) is None]
    if not missing:
        return
    if os.environ.get(REEXEC):
        raise Usage("--wheels", f"{', '.join(n for _, n in missing)} still missing after installing {folder}")
    files = []
    for _w, name in missing:
        got = sorted(folder.glob(f"{name.replace('-', '_')}-*.whl")) if folder.is_dir() else []
        if not got:
            raise Usage("--wheels", f"{name} is missing here and {folder} holds no {name} wheel; run make gpu-wheels "
                                    f"(pip download, where PyPI is reachable) and carry {folder}")
        files.append(str(got[-1]))
    site = tempfile.mkdtemp(prefix="dvasim-site-")
    rc = subprocess.call([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                          "--no-cache-dir", "--target", site, *files])
    if rc != 0:
        raise Usage("--wheels", f"pip could not install {', '.join(files)} (status {rc}); download them again with "
                                "make gpu-wheels")
    env = dict(os.environ, **{REEXEC: site})
    env["PYTHONPATH"] = os.pathsep.join([site, str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    print(f"installed {', '.join(n for _, n in missing)} from {folder} into {site}; restarting", flush=True)
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, str(Path(__file__).resolve()), *argv], env)


# ----------------------------------------------------------------------------- records
class Log:
    """Lines to stdout and ``run.log``, steps to ``progress.jsonl`` (both in the traces folder, appended)."""

    def __init__(self, plan: Plan):
        self.plan = plan
        plan.traces.mkdir(parents=True, exist_ok=True)

    def __call__(self, msg: str) -> None:
        line = f"[{self.plan.elapsed():6.1f} s] {msg}"
        print(line, flush=True)
        with open(self.plan.traces / "run.log", "a", encoding="utf-8") as f:
            f.write(line + "\n")

    def step(self, job: str, status: str, **kw) -> None:
        rec = {"job": job, "status": status, "elapsed_s": round(self.plan.elapsed(), 2), **kw}
        with open(self.plan.traces / "progress.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(rec, default=str) + "\n")

    def steps(self) -> list[dict]:
        """Every step's latest record (a resumed run's records come after the earlier run's)."""
        p = self.plan.traces / "progress.jsonl"
        recs = [json.loads(x) for x in p.read_text(encoding="utf-8").splitlines() if x.strip()] if p.is_file() else []
        return list({r["job"]: r for r in recs}.values())


def _git_commit() -> dict[str, Any]:
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "note": "no git here (a copy of the working tree)"}
    if head.returncode != 0:
        return {"commit": None, "note": "no git here (a copy of the working tree)"}
    return {"commit": head.stdout.strip(), "local_changes": bool(dirty.stdout.strip())}


def environment(plan: Plan) -> dict[str, Any]:
    """The machine, the software and the date of a measuring run (``environment.json``)."""
    import platform

    import torch

    from dvasim.reporting.result import versions

    env: dict[str, Any] = {"date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                           "device": plan.device, "python": platform.python_version(), "torch": torch.__version__,
                           "cuda": torch.version.cuda, "cpu_count": os.cpu_count(), "platform": platform.platform(),
                           "dvasim": _git_commit(), "versions": versions(),
                           "command": " ".join([_rel(Path(sys.argv[0])), *sys.argv[1:]])}
    if plan.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=torch.cuda.get_device_name(), gpu_multiprocessors=props.multi_processor_count,
                   gpu_memory_gib=round(props.total_memory / 2**30, 1), cudnn=torch.backends.cudnn.version(),
                   tf32_matmul=torch.backends.cuda.matmul.allow_tf32, tf32_cudnn=torch.backends.cudnn.allow_tf32)
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                                "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
            env["nvidia_smi"] = q.stdout.strip() or q.stderr.strip()
            env["driver"] = q.stdout.split(",")[1].strip() if q.returncode == 0 and "," in q.stdout else None
        except (OSError, subprocess.SubprocessError) as e:
            env["driver"], env["nvidia_smi"] = None, f"nvidia-smi failed: {e}"
    else:
        cpu = next((ln.split(":", 1)[1].strip() for ln in _read("/proc/cpuinfo").splitlines()
                    if ln.startswith("model name")), platform.processor())
        env.update(gpu=None, cpu=cpu)
    return env


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


# ----------------------------------------------------------------------------- configs
def _tokens(model: str) -> bool:
    return model.startswith("bert")


def case_name(model: str, policy: str, load: float) -> str:
    return f"{model}_{policy}_{load:g}"


def workload(plan: Plan, model: str, rate: float, n: int) -> dict[str, Any]:
    wl: dict[str, Any] = {"kind": "poisson", "rate_qps": round(float(rate), 1), "n_queries": int(n), "seed": SEED}
    if _tokens(model):
        wl["seq_len_dist"] = "glue:RTE"
    return wl


def case_config(plan: Plan, model: str, policy: str, rate: float, info: dict | None = None) -> dict[str, Any]:
    """The replay config of one case (``info``: the model's ``matrix.json`` entry, for the policy's parameters)."""
    pol: dict[str, Any] = {"name": policy, "max_batch_size": plan.max_batch}
    if policy == "delaybatch":
        pol["max_queue_delay_ms"] = info["delay_window_ms"]
    elif policy == "dvabatch":
        pol.update(info["dvabatch"])
    return {"model": {"name": model, "device": plan.table_device, "cuts": list(plan.cuts[model])}, "policy": pol,
            "workload": workload(plan, model, rate, plan.n_queries), "qos": {"target_ms": QOS_MS},
            "engine": {"buffer_pairs": 2}, "replay": {"modules": "cudagraph"}}


def config_toml(cfg: dict[str, Any], header: list[str]) -> str:
    from dvasim.fitting.fit import toml_value

    lines = [f"# {h}" for h in header]
    for section, table in cfg.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- profile and the matrix's rates
def profile(plan: Plan, log: Log, model: str) -> Path:
    """``<model>_table.csv`` (and ``.launch.csv``) measured now, unless a finished one is there."""
    from dvasim import config as cfgmod
    from dvasim.fitting.validate import gpu_stage_table
    from dvasim.model.profiling.profiler import launch_path

    path = plan.traces / f"{model}_table.csv"
    if path.is_file() and launch_path(path).is_file():
        log(f"profile {model}: kept {path.name}")
        return path
    t = time.monotonic()
    cfg = cfgmod.resolve(case_config(plan, model, "zerobatch", 100.0))
    gpu_stage_table(cfg, path, repeats=plan.profile_repeats, warmup=plan.profile_warmup, device=plan.device,
                    seq_lens=profile_lengths() if _tokens(model) else None)
    log(f"profile {model}: {path.name} in {time.monotonic() - t:.1f} s")
    log.step(f"profile {model}", "done", wall_s=round(time.monotonic() - t, 2))
    return path


def profile_lengths() -> list[int]:
    """:data:`BERT_LENGTHS` up to the first that holds the longest input of the whole length distribution (GLUE
    RTE: 176 tokens), so that every draw of it fits the table (a replay runs only the buckets its inputs need)."""
    from dvasim.workload.lengths import load_lengths

    top = int(max(load_lengths("glue:RTE")))
    return [L for L in BERT_LENGTHS if L <= min([x for x in BERT_LENGTHS if x >= top] or [BERT_LENGTHS[-1]])]


def _median_bucket(table, plan: Plan, model: str) -> int | None:
    """The table's length that holds the workload's median input (token models), else None."""
    if table.seq_lens is None:
        return None
    import numpy as np

    from dvasim.workload import workload_from_config

    lens = workload_from_config(workload(plan, model, 100.0, plan.n_queries), needs_seq_len=True).seq_lens
    med = float(np.median(lens))
    return int(next((L for L in table.seq_lens if L >= med), table.seq_lens[-1]))


def matrix_info(plan: Plan, log: Log, model: str, table_path: Path) -> dict[str, Any]:
    """The model's capacity (the simulator's saturated ZeroBatch throughput on the table, default engine), the rate
    of every load, DelayBatch's window (the batch-1 latency) and DVABatch's parameters; kept in ``matrix.json``."""
    from dvasim.api import run
    from dvasim.fitting.check import recorded_dvabatch
    from dvasim.model.table import LatencyTable

    book = plan.traces / "matrix.json"
    known = json.loads(book.read_text()) if book.is_file() else {}
    if model in known:
        return known[model]
    t = LatencyTable.load(table_path)
    L = _median_bucket(t, plan, model)
    alone = sum(t.latency(s, 1, L) for s in range(t.n_stages))
    cfg = {"model": {"table": str(table_path.resolve())},
           "policy": {"name": "zerobatch", "max_batch_size": plan.max_batch},
           "workload": workload(plan, model, 20.0 * 1000.0 / alone, 300 if plan.tiny else 2000),
           "qos": {"target_ms": QOS_MS}, "engine": {"buffer_pairs": 2}}
    cap = float(run(cfg, progress=False).summary["throughput_qps"])
    info = {"table": table_path.name, "cuts": plan.cuts[model], "capacity_qps": round(cap, 1),
            "rates_qps": {f"{ld:g}": round(ld * cap, 1) for ld in plan.loads},
            "delay_window_ms": round(alone, 3), "median_length_bucket": L,
            "dvabatch": recorded_dvabatch(table_path, plan.max_batch)}
    known[model] = info
    book.write_text(json.dumps(known, indent=1) + "\n")
    log(f"{model}: capacity {cap:.0f} qps (simulated, ZeroBatch, table); rates "
        + ", ".join(f"{k} -> {v}" for k, v in info["rates_qps"].items()) + f"; DelayBatch window {alone:.3f} ms")
    return info


SATURATE = 3.0  # the saturation replay offers this many times the table's capacity


def measure_capacity(plan: Plan, log: Log, model: str, info: dict) -> dict[str, Any]:
    """The loads' reference measured, not simulated: a ZeroBatch replay of ``--queries`` queries offered at
    :data:`SATURATE` times the table's capacity (``saturation_<model>/r1/``, kept with the others); its
    throughput becomes ``capacity_qps`` and the rates are fractions of it (``table_capacity_qps`` keeps the
    simulated one). Why: the table holds GPU time only, and on the H200 (``traces/gpu_matrix/h200_2026-11-28``,
    loads from the table) ZeroBatch served 1,343-1,423 qps of ResNet152 at 0.6 and 0.85 of a 2,522 qps table
    capacity: both loads were overloads, whose 1,000-query latencies measure the run's length, not the server.
    Where the replay fails, the table's capacity stays (``capacity_from`` says which)."""
    if "table_capacity_qps" in info:
        return info
    rate = round(SATURATE * info["capacity_qps"], 1)
    folder = plan.traces / f"saturation_{model}" / "r1"
    got: dict[str, Any] = {}
    if not (folder / "summary.json").is_file():
        got = replay_job(plan, log, model, "zerobatch", SATURATE, 1, info, folder=folder)
        if got.get("status") == "hung":
            log.step(f"saturate {model}", "hung", **{k: v for k, v in got.items() if k != "status"})
            log(f"saturate {model}: HUNG ({got['error']})")
            gave_up(plan, log)
            return info
    summ = json.loads((folder / "summary.json").read_text()) if (folder / "summary.json").is_file() else {}
    thr = float(summ.get("throughput_qps") or 0.0)
    new = dict(info, table_capacity_qps=info["capacity_qps"])
    if got.get("status", "done") == "done" and thr > 0:
        new.update(capacity_qps=round(thr, 1), capacity_from=f"measured: ZeroBatch replay of {plan.n_queries} "
                   f"queries offered at {rate:g} qps ({SATURATE:g}x the table's capacity), {folder.parent.name}")
    else:
        new["capacity_from"] = f"the table (the saturation replay did not finish: {got.get('error', 'no summary')})"
    new["rates_qps"] = {f"{ld:g}": round(ld * new["capacity_qps"], 1) for ld in plan.loads}
    book = plan.traces / "matrix.json"
    known = json.loads(book.read_text()) if book.is_file() else {}
    known[model] = new
    book.write_text(json.dumps(known, indent=1) + "\n")
    log(f"{model}: capacity {new['capacity_qps']:.0f} qps ({new['capacity_from']}; the table says "
        f"{info['capacity_qps']:.0f}); rates " + ", ".join(f"{k} -> {v}" for k, v in new["rates_qps"].items()))
    log.step(f"saturate {model}", "done" if "measured" in new["capacity_from"] else "failed",
             capacity_qps=new["capacity_qps"], table_capacity_qps=info["capacity_qps"])
    return new


# ----------------------------------------------------------------------------- one replay
def replay_job(plan: Plan, log: Log, model: str, policy: str, load: float, rep: int, info: dict,
               folder: Path | None = None) -> dict[str, Any]:
    """Replay one case once and write its folder ``<case>/r<rep>/`` whole (written under ``.partial`` and renamed):
    ``config.toml``, ``queries.csv.gz``, ``executions.csv.gz``, ``summary.json``, ``config.json``. A replay past
    three times its planned length plus 30 s (or past the budget and a minute) is stopped: its records so far
    are written and it is marked interrupted."""
    from dvasim.engines.replay.engine import ReplayError, Stopped, replay

    folder = folder or plan.traces / case_name(model, policy, load) / f"r{rep}"
    rate = round(load * info["capacity_qps"], 1)
    cfg = case_config(plan, model, policy, rate, info)
    planned = plan.n_queries / rate
    limit = 3.0 * planned + 30.0  # (the graphs are captured before: :func:`_capture`)
    t0 = time.monotonic()
    hard = plan.t0 + plan.budget_s + 60.0

    def stop() -> str | None:
        now = time.monotonic()
        return "the time limit" if now > t0 + limit or now > hard else None

    meta: dict[str, Any] = {"case": folder.parent.name, "repeat": rep, "load": load, "rate_qps": rate,
                            "planned_s": round(planned, 3), "limit_s": round(limit, 1)}
    try:
        res = replay(cfg, device=plan.device, table=str(plan.traces / info["table"]), stop=stop)
    except Stopped as e:
        if getattr(e, "blocked", None):  # the warm-up's stage calls never returned: the device cannot be trusted
            return {"status": "hung", "error": str(e), "model": model, "limit_s": round(limit, 1)}
        return {"status": "failed", "error": f"stopped during start-up: {e}"}
    except ReplayError as e:
        res = getattr(e, "run_result", None)
        meta["error"] = str(e)
        if res is None:
            return {"status": "failed", "error": str(e)}
    meta["wall_s"] = round(time.monotonic() - t0, 2)
    meta["serve_s"] = round(float(res.summary.get("replay_wall_s", 0.0)), 2)
    write_run(folder, cfg, res, meta, plan)
    status = "failed" if "error" in meta else "interrupted" if res.summary.get("interrupted") else "done"
    return {"status": status, **{k: meta[k] for k in ("wall_s", "serve_s", "planned_s")},
            **({"error": meta["error"]} if "error" in meta else {})}


def write_run(folder: Path, cfg: dict, res, meta: dict, plan: Plan) -> None:
    """The replay's files, gzipped, into ``folder`` (complete or absent)."""
    import gzip

    from dvasim.engines.replay.engine import write_executions
    from dvasim.reporting.result import write_outputs

    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    write_outputs(res, tmp, figure=False, csv=True)
    write_executions(res, tmp)
    header = [f"replayed by experiments/validation/gpu_matrix.py on {plan.device} ({meta['case']}, repeat "
              f"{meta['repeat']}), the policy deciding from ../../{cfg['model']['name']}_table.csv",
              "(replay(config, table=...)); simulate it with [model] table = that file (dvasim.fitting.check)"]
    (tmp / "config.toml").write_text(config_toml(cfg, header), encoding="utf-8")
    for name in ("queries.csv", "executions.csv"):
        if (tmp / name).is_file():
            with open(tmp / name, "rb") as src, gzip.open(tmp / f"{name}.gz", "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst)
            (tmp / name).unlink()
    (tmp / "queries.parquet").unlink(missing_ok=True)
    summary = json.loads((tmp / "summary.json").read_text())
    summary["gpu_matrix"] = meta
    (tmp / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)


# ----------------------------------------------------------------------------- the co-run calibration
class _HostOps:
    """:class:`dvasim.model.stages.cuda.CudaOps`' stream calls on the CPU: a call runs at once."""

    def new_stream(self, name):
        return None

    def new_event(self, name):
        return None

    def launch(self, stream, fn):
        return fn()

    def record_event(self, stream, event) -> None:
        pass

    def synchronize_event(self, event) -> None:
        pass


def co_run(setup, batch: int, length: int | None, calls: int, device: str,
           modules: str = "cudagraph") -> dict[str, Any]:
    """Each stage of ``setup`` (its lane-0 CUDA graphs, those the replays run; or, ``modules = "torchscript"``, its
    TorchScript stages) called ``calls`` times alone, one after the other, then all together, one thread each on its
    own stream, synchronising after every call (the H100 experiment of ``overlap_4threads.csv``). ``overlap``: the
    alone times added up over the time together."""
    import threading

    import torch

    n = setup.pipeline.n_stages
    gen = torch.Generator().manual_seed(batch)
    if setup.lane_stages is not None:  # CUDA graphs: their static buffers hold each stage's input
        graphs, bufs = setup.lane_stages[0], setup.buffers
        L = next((b for b in setup.buckets if length is not None and b >= length), None) or 1
        x = (setup.model.example_input(batch, L, generator=gen) if setup.model.input_kind == "tokens"
             else setup.model.example_input(batch, generator=gen))
        rows = range(batch)
        with torch.inference_mode():
            bufs.write(0, 0, 0, rows, x, L)
            for s, g in enumerate(graphs):
                bufs.write(0, s + 1, 0, rows, g(bufs.read(0, s, 0, rows, L)), L)
        carries = [bufs.read(0, s, 0, rows, L) for s in range(n)]
    else:  # modules called directly: each stage's input is the stage before's output
        graphs = list(setup.stages)
        L = int(length) if length is not None and setup.model.input_kind == "tokens" else None
        x = (setup.model.example_input(batch, L, generator=gen) if L is not None
             else setup.model.example_input(batch, generator=gen))
        h = x.to(setup.device) if hasattr(x, "to") else x
        carries = []
        with torch.inference_mode():
            for g in graphs:
                carries.append(h)
                h = g(h)
    if device == "cuda":
        from dvasim.model.stages.cuda import CudaOps

        ops: Any = CudaOps(setup.device)  # (the TorchScript stages have no buffers: the setup's device)
        torch.cuda.synchronize()
    else:
        ops = _HostOps()
    streams, events = [ops.new_stream(s) for s in range(n)], [ops.new_event(s) for s in range(n)]

    def run(s: int, k: int) -> None:
        with torch.inference_mode():
            for _ in range(k):
                ops.launch(streams[s], lambda: graphs[s](carries[s]))
                ops.record_event(streams[s], events[s])
                ops.synchronize_event(events[s])

    prev = torch.get_num_threads()
    torch.set_num_threads(1)  # (the CPU's intra-op threads, as the replay sets them; nothing on a GPU)
    try:
        for s in range(n):
            run(s, max(2, calls // 10))  # warm
        alone = []
        for s in range(n):
            t = time.perf_counter()
            run(s, calls)
            alone.append(time.perf_counter() - t)
        gate = threading.Barrier(n + 1)
        threads = [threading.Thread(target=lambda s=s: (gate.wait(), run(s, calls))) for s in range(n)]
        for th in threads:
            th.start()
        gate.wait()
        t = time.perf_counter()
        for th in threads:
            th.join()
        together = time.perf_counter() - t
    finally:
        torch.set_num_threads(prev)
    return {"model": setup.resolved.name, "batch_size": batch,
            "seq_len": (L if setup.buckets else None) if setup.lane_stages is not None else L, "modules": modules, "threads": n, "calls": calls, "alone_ms_min": round(min(alone) * 1e3 / calls, 5),
            "alone_ms_max": round(max(alone) * 1e3 / calls, 5), "overlap": round(sum(alone) / together, 4),
            "alone_ms_by_stage": ";".join(f"{a * 1e3 / calls:.5f}" for a in alone)}


OVERLAP_COLUMNS = ("model", "batch_size", "seq_len", "modules", "threads", "calls", "alone_ms_min", "alone_ms_max",
                   "overlap", "alone_ms_by_stage")


def co_run_job(plan: Plan, log: Log, model: str, batch: int, length: int | None, modules: str,
               info: dict) -> dict[str, Any]:
    """One co-run appended to ``overlap_4threads.csv`` (the shipped file's format, its provenance lines first)."""
    from dvasim.engines.replay.engine import prepare

    path = plan.traces / "overlap_4threads.csv"
    t = time.monotonic()
    cfg = case_config(plan, model, "zerobatch", round(plan.loads[0] * info["capacity_qps"], 1), info)
    cfg["replay"] = {**cfg.get("replay", {}), "modules": modules}
    setup = prepare(cfg, device=plan.device, table=str(plan.traces / info["table"]))  # the replays' stages
    row = co_run(setup, batch, length, plan.calls, plan.device, modules)
    if not path.is_file():
        head = [f"source: experiments/validation/gpu_matrix.py on {plan.device} ({environment_line(plan)}); each "
                "stage of the model (cut as in matrix.json) replayed as the replays' CUDA graph by its own thread "
                "on its own stream, synchronising after every call, against each stage alone",
                "columns: as traces/gpu/h100/measured/overlap_4threads.csv (alone_ms_*: one call's time alone, the "
                "range over the stages; overlap: the alone times added up over the time together)"]
        path.write_text("".join(f"# {h}\n" for h in head) + ",".join(OVERLAP_COLUMNS) + "\n", encoding="utf-8")
    with open(path, "a", encoding="utf-8") as f:
        f.write(",".join("" if row[c] is None else str(row[c]) for c in OVERLAP_COLUMNS) + "\n")
    return {"status": "done", "wall_s": round(time.monotonic() - t, 2), "overlap": row["overlap"]}


def environment_line(plan: Plan) -> str:
    p = plan.traces / "environment.json"
    runs = json.loads(p.read_text())["runs"] if p.is_file() else []
    e = runs[-1] if runs else {}
    return f"{e.get('gpu') or e.get('cpu')}, torch {e.get('torch')}, {e.get('date_utc')}"


# ----------------------------------------------------------------------------- measuring, time-boxed
def jobs(plan: Plan) -> list[tuple]:
    """Every step after the profiles, the most valuable first: ZeroBatch (both repeats: the fit needs them), the
    co-runs (the calibration), then one repeat of every other case, then the further repeats."""
    reps = range(1, plan.repeats + 1)
    zb = [("replay", m, "zerobatch", ld, r) for r in reps for m in plan.models for ld in plan.loads]
    co = [("corun", m, b, L, mod) for m, b, L, mod in plan.co_runs if m in plan.models]
    others = [p for p in plan.policies if p != "zerobatch"]
    rest = [("replay", m, p, ld, r) for r in reps for m in plan.models for p in others for ld in plan.loads]
    return zb + co + rest


def _job_name(job: tuple) -> str:
    if job[0] == "replay":
        return f"replay {case_name(*job[1:4])} r{job[4]}"
    return f"co-run {job[1]} batch {job[2]}" + (f" length {job[3]}" if job[3] else "") + f" {job[4]}"


def measure(plan: Plan, log: Log) -> None:
    """Profile, then run :func:`jobs` in order while the budget lasts (the module docstring)."""
    import torch

    from dvasim.engines.replay.engine import reused_graphs

    if plan.device == "cuda":  # as the H100 measurements of traces/gpu/h100/measured were made
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    book = plan.traces / "environment.json"
    runs = json.loads(book.read_text())["runs"] if book.is_file() else []
    book.write_text(json.dumps({"runs": [*runs, environment(plan)]}, indent=1, default=str) + "\n")
    write_readme(plan, log)
    infos, setup_s = {}, {}
    hung = hung_models(log)
    for m in plan.models:
        if m in hung and not (plan.traces / f"{m}_table.csv").is_file():
            log(f"profile {m}: skipped (an earlier step hung: {hung[m]})")
            continue
        try:
            with watch(plan, f"profile {m}", m, STEP_LIMIT_S["profile"]):
                infos[m] = matrix_info(plan, log, m, profile(plan, log, m))
        except Exception as e:  # a model that cannot be profiled: its steps are skipped, the others run
            log(f"profile {m}: FAILED {type(e).__name__}: {e}")
            log.step(f"profile {m}", "failed", error=f"{type(e).__name__}: {e}")
        pack(plan, log, quiet=True)
    last_pack = time.monotonic()
    with reused_graphs():
        for m in list(infos):  # every model's graphs captured once, before the replays' clocks start
            if m in hung:
                log(f"{m}: its GPU steps are skipped (an earlier step hung: {hung[m]})")
                continue
            with watch(plan, f"capture {m}", m, STEP_LIMIT_S["capture"]):
                if not _capture(plan, log, m, infos[m]):
                    infos.pop(m)
                    continue
            with watch(plan, f"saturate {m}", m, 3.0 * plan.n_queries / infos[m]["capacity_qps"] + 45.0):
                infos[m] = measure_capacity(plan, log, m, infos[m])
            if "table_capacity_qps" not in infos[m]:  # its saturation replay hung (unsupervised: go on without it)
                hung[m] = f"saturate {m}"
        for job in jobs(plan):
            name, m = _job_name(job), job[1]
            if m not in infos:
                log.step(name, "skipped", reason="no table")
                continue
            if m in hung:
                if name != hung[m] and not _finished(plan, job):
                    log.step(name, "skipped", reason=f"an earlier step of {m} hung ({hung[m]})")
                continue
            if _finished(plan, job):  # (a resumed run: kept, whatever the budget)
                continue
            est = (setup_s.get(m, 15.0 if plan.device == "cuda" else 2.0)
                   + (plan.n_queries / (job[3] * infos[m]["capacity_qps"]) if job[0] == "replay" else 5.0))
            if plan.left() < est:
                log(f"{name}: skipped (estimated {est:.0f} s, {max(plan.left(), 0):.0f} s of the budget left)")
                log.step(name, "skipped", reason="budget", estimate_s=round(est, 1))
                continue
            limit = (3.0 * plan.n_queries / (job[3] * infos[m]["capacity_qps"]) + 45.0 if job[0] == "replay"
                     else STEP_LIMIT_S["co-run"])
            with watch(plan, name, m, limit):
                got = _run_job(plan, log, job, infos[m])
            if got.get("status") == "hung":
                gave_up(plan, log)
                hung[m] = name
                continue
            if got.get("status") in ("done", "interrupted") and job[0] == "replay":
                setup_s[m] = max(0.5, got["wall_s"] - got["planned_s"])  # a replay's time beyond its arrivals
            if plan.out is not None and time.monotonic() - last_pack > 30.0:
                pack(plan, log, quiet=True)
                last_pack = time.monotonic()
    write_readme(plan, log)


@contextlib.contextmanager
def watch(plan: Plan, step: str, model: str, limit_s: float):
    """While the block runs, ``current_step.json`` names the step, its model and its deadline (``limit_s`` from
    now, capped by ``--step-limit-s``), for :func:`supervise`. In a test (``$DVASIM_GPU_MATRIX_HANG`` names the
    step, in a supervised child) the step blocks forever, as the H200's BERT-base replay did."""
    if plan.step_limit_s is not None:
        limit_s = min(limit_s, plan.step_limit_s)
    path = plan.traces / STEP_FILE
    tmp = path.with_suffix(".partial")
    tmp.write_text(json.dumps({"step": step, "model": model, "limit_s": round(limit_s, 1),
                               "deadline_unix": time.time() + limit_s, "pid": os.getpid()}))
    os.replace(tmp, path)
    try:
        if os.environ.get(CHILD) and os.environ.get(HANG) == step:
            threading.Event().wait()  # (a test's hang: only the supervisor ends it)
        yield
    finally:
        path.unlink(missing_ok=True)


def hung_models(log: Log) -> dict[str, str]:
    """model -> the step of it that hung (or whose process died) in an earlier child: its GPU steps are skipped
    (and that step keeps its record)."""
    return {s["model"]: s["job"] for s in log.steps() if s["status"] in ("hung", "died") and s.get("model")}


def gave_up(plan: Plan, log: Log) -> None:
    """A step's stage calls did not return (recorded ``hung``): a supervised child ends here, with
    :data:`HUNG_EXIT`, so that a fresh process (a fresh CUDA context) resumes; unsupervised, the caller skips the
    model and goes on in this process."""
    if os.environ.get(CHILD):
        log("the measuring child ends: a fresh one resumes without this model")
        (plan.traces / STEP_FILE).unlink(missing_ok=True)
        sys.stdout.flush()
        os._exit(HUNG_EXIT)


def supervise(plan: Plan, log: Log, argv: list[str]) -> int:
    """Measure in a child process (this script again, ``$DVASIM_GPU_MATRIX_CHILD`` set), watching its
    ``current_step.json``. A step past its deadline (a device hang: on the H200 a BERT-base replay's warm-up never
    returned, and the replay's own time limit, asked between passes, never fired) gets the child killed; the step
    is recorded ``hung`` with its model, and a new child resumes the matrix (finished steps are kept) with that
    model's GPU steps skipped. A child that dies likewise (``died``). The child fits, predicts and packs; if no
    child gets that far, this process does, on the CPU."""
    path = plan.traces / STEP_FILE
    env = dict(os.environ, **{T0_UNIX: str(time.time() - plan.elapsed())})
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv]
    for k in range(1, CHILDREN + 1):
        path.unlink(missing_ok=True)
        proc = subprocess.Popen(cmd, env={**env, CHILD: str(k)})
        cur: dict | None = None
        try:
            while proc.poll() is None:
                time.sleep(0.5)
                try:
                    cur = json.loads(path.read_text())
                except (OSError, ValueError):
                    cur = None
                if cur is not None and time.time() > cur["deadline_unix"]:
                    proc.kill()
                    proc.wait()
                    break
        except BaseException:
            proc.kill()
            raise
        if proc.returncode == 0:
            return 0
        if proc.returncode == HUNG_EXIT:  # the child recorded the hung step itself
            continue
        what = "hung" if cur is not None and time.time() > cur["deadline_unix"] else "died"
        if cur is None:  # died outside any step: nothing to blame, nothing to skip
            log(f"measuring child {k}: exited with status {proc.returncode} outside a step")
            log.step(f"child {k}", "died", status=proc.returncode)
            continue
        log(f"{cur['step']}: {what.upper()} (" + (f"past its limit of {cur['limit_s']:g} s; the child is killed"
                                                 if what == "hung" else f"the child exited with status "
                                                                        f"{proc.returncode}")
            + f"); {cur['model']}'s remaining GPU steps are skipped")
        log.step(cur["step"], what, model=cur["model"], limit_s=cur["limit_s"], child=k)
    path.unlink(missing_ok=True)
    log(f"{CHILDREN} measuring children ended without finishing: fit and predict here")
    write_readme(plan, log)
    analyse(plan, log)
    pack(plan, log)
    return 0


def _finished(plan: Plan, job: tuple) -> bool:
    """The step's output is already there (a replay's folder, a co-run's row)."""
    if job[0] == "replay":
        return (plan.traces / case_name(*job[1:4]) / f"r{job[4]}" / "summary.json").is_file()
    path = plan.traces / "overlap_4threads.csv"
    if not path.is_file():
        return False
    from dvasim.studies.contention import load_overlaps

    have = load_overlaps(path, modules=None)
    return bool(((have["model"] == job[1]) & (have["batch_size"] == job[2]) & (have["modules"] == job[4])).any())


def _capture(plan: Plan, log: Log, model: str, info: dict) -> bool:
    """The replays' CUDA graphs of ``model`` (every batch size, every length bucket of the workload), captured
    into :func:`dvasim.engines.replay.engine.reused_graphs`' store, so that no replay's time limit pays for them."""
    from dvasim.engines.replay.engine import prepare

    t = time.monotonic()
    try:
        cfg = case_config(plan, model, "zerobatch", round(plan.loads[0] * info["capacity_qps"], 1), info)
        setup = prepare(cfg, device=plan.device, table=str(plan.traces / info["table"]))
    except Exception as e:  # the model's steps are skipped, the others run
        log(f"capture {model}: FAILED {type(e).__name__}: {e}")
        log.step(f"capture {model}", "failed", error=f"{type(e).__name__}: {e}")
        return False
    n = sum(len(g.graphs) for lane in setup.lane_stages for g in lane)
    log(f"capture {model}: {n} CUDA graphs (buckets {setup.buckets or '-'}) in {time.monotonic() - t:.1f} s")
    return True


def _run_job(plan: Plan, log: Log, job: tuple, info: dict) -> dict[str, Any]:
    name = _job_name(job)
    t = time.monotonic()
    try:
        got = (replay_job(plan, log, *job[1:], info) if job[0] == "replay"
               else co_run_job(plan, log, *job[1:], info))
    except Exception as e:  # one failed step must not end the matrix: it is recorded, the next runs
        got = {"status": "failed", "error": f"{type(e).__name__}: {e}"}
    log.step(name, got["status"], **{k: v for k, v in got.items() if k != "status"})
    extra = f" ({got['error']})" if "error" in got else ""
    log(f"{name}: {got['status']} in {time.monotonic() - t:.1f} s{extra}")
    return got


# ----------------------------------------------------------------------------- fit and predict
def run_folders(case: Path) -> list[Path]:
    """A case's finished replays that ran to their end (no error, not interrupted), in repeat order."""
    out = []
    for d in sorted(case.glob("r[0-9]*")):
        if d.name.endswith(".partial") or not (d / "summary.json").is_file():
            continue
        s = json.loads((d / "summary.json").read_text())
        if not s.get("interrupted") and "error" not in s.get("gpu_matrix", {}) and not s.get("stuck"):
            out.append(d)
    return out


def real_summary(plan: Plan, model: str, table: Path) -> tuple[Path, dict[tuple[str, float], list[Path]]]:
    """``<model>_summary.json`` in the format of ``traces/h100_replays/`` (what :func:`dvasim.fitting.check.
    real_runs` reads): per case its replays' figures as lists, and the default engine's simulation of the case
    (GPU time only, the table) as ``sim_*``. Returns its path and the finished replays per (policy, load)."""
    from dvasim.api import run
    from dvasim.fitting.check import case_config as sim_config

    cases: dict[tuple[str, float], list[Path]] = {}
    for d in sorted(plan.traces.glob(f"{model}_*")):
        policy, _, load = d.name[len(model) + 1:].rpartition("_")
        if d.is_dir() and policy in POLICIES and run_folders(d):
            cases[(policy, float(load))] = run_folders(d)
    out = []
    for (policy, load), dirs in sorted(cases.items(), key=lambda kv: (POLICIES.index(kv[0][0]), kv[0][1])):
        real = [json.loads((d / "summary.json").read_text()) for d in dirs]
        sim = run(sim_config(dirs[0], table), progress=False).summary
        row: dict[str, Any] = {"model": model, "policy": policy, "load": load,
                               "rate_qps": real[0]["gpu_matrix"]["rate_qps"], "runs": [d.name for d in dirs]}
        for k in ("mean_latency_ms", "p50_latency_ms", "p99_latency_ms", "throughput_qps", "n_completed"):
            row[f"sim_{k}"] = sim.get(k)
            row[f"real_{k}"] = [r.get(k) for r in real]
        for k in ("launch_overhead_ms_mean", "admission_delay_ms_mean", "mean_exit_batch_size"):
            row[f"real_{k}"] = [r.get(k) for r in real]
        out.append(row)
    path = plan.traces / f"{model}_summary.json"
    path.write_text(json.dumps(out, indent=1, default=_json_num) + "\n")
    return path, cases


def _json_num(o):
    try:
        return float(o)
    except (TypeError, ValueError):
        return str(o)


def calibration(plan: Plan, log: Log) -> dict[str, Any] | None:
    """``contention_share`` fitted on the batch-1 co-runs (:func:`dvasim.studies.contention.fit_share`, the stages'
    times and demands from this run's tables), the other co-runs held out; every co-run measured and predicted
    without contention and with it. None without a batch-1 co-run."""
    import pandas as pd

    from dvasim.model.table import LatencyTable
    from dvasim.studies.contention import fit_share, four_threads, load_overlaps

    path = plan.traces / "overlap_4threads.csv"
    if not path.is_file():
        return None
    rows = load_overlaps(path).to_dict("records")
    specs = []
    for r in rows:
        t = LatencyTable.load(plan.traces / f"{r['model']}_table.csv")
        L = None if pd.isna(r["seq_len"]) else int(r["seq_len"])
        b = int(r["batch_size"])
        specs.append([(t.latency(s, b, L), t.demand(s, b, L)) for s in range(t.n_stages)])
    fit_on = [i for i, r in enumerate(rows) if int(r["batch_size"]) == 1]
    if not fit_on:
        return None
    exact = fit_share([specs[i] for i in fit_on], [rows[i]["calls"] for i in fit_on],
                      [rows[i]["overlap"] for i in fit_on])
    share = round(exact, 3)
    for i, r in enumerate(rows):
        r["calibrated"] = i in fit_on
        r["predicted_none"] = four_threads(specs[i], "none", calls=int(r["calls"]))["overlap"]
        r["predicted_overlap"] = four_threads(specs[i], "overlap", share, calls=int(r["calls"]))["overlap"]
        r["rel_error_overlap"] = r["predicted_overlap"] / r["overlap"] - 1.0
        r["rel_error_none"] = r["predicted_none"] / r["overlap"] - 1.0
    log(f"calibration: contention_share {share} on {len(fit_on)} batch-1 co-runs; "
        + "; ".join(f"{r['model']} b{int(r['batch_size'])}: measured {r['overlap']:.2f}x, none "
                    f"{r['predicted_none']:.2f}x, overlap {r['predicted_overlap']:.2f}x" for r in rows))
    return {"share": share, "share_exact": exact, "n_calibration_points": len(fit_on),
            "n_held_out": len(rows) - len(fit_on), "rows": rows}


def host_calibration(plan: Plan, log: Log) -> dict[str, Any] | None:
    """The host path's contention from the TorchScript co-runs: per co-run the launching cores whose simulated
    co-run overlaps as measured (:func:`dvasim.studies.contention.fit_host_cores`: each stage's measured time
    alone as its host work, its GPU time from this run's table), and their median. None without such a co-run.
    (Not used by the predictions here, whose stages are CUDA graphs; for engines of TorchScript stages.)"""
    import pandas as pd

    from dvasim.model.table import LatencyTable
    from dvasim.studies.contention import fit_host_cores, load_overlaps

    path = plan.traces / "overlap_4threads.csv"
    if not path.is_file():
        return None
    have = load_overlaps(path, modules="torchscript")
    rows = [r for r in have.to_dict("records") if isinstance(r.get("alone_ms_by_stage"), str)]
    for r in rows:
        t = LatencyTable.load(plan.traces / f"{r['model']}_table.csv")
        L = None if pd.isna(r["seq_len"]) or t.seq_lens is None else int(r["seq_len"])
        b = int(r["batch_size"])
        specs = [(t.latency(s, b, L), t.demand(s, b, L)) for s in range(t.n_stages)]
        launch = [float(x) for x in r["alone_ms_by_stage"].split(";")]
        r["host_bound_stages"] = sum(la > g for la, (g, _) in zip(launch, specs))
        r["cores"] = round(fit_host_cores(specs, launch, int(r["calls"]), float(r["overlap"])), 2)
    if not rows:
        return None
    cores = float(pd.Series([r["cores"] for r in rows]).median())
    log("host calibration: launching cores " + "; ".join(
        f"{r['model']} b{int(r['batch_size'])}: overlap {r['overlap']:.2f}x -> {r['cores']:.2f} cores" for r in rows)
        + f"; median {cores:.2f}")
    return {"cores": cores, "rows": rows}


def fit_model(plan: Plan, log: Log, model: str, table: Path, cases: dict, summary_json: Path,
              cal: dict | None) -> tuple[Path | None, Path | None, dict[str, Any]]:
    """``dvasim fit`` on the model's ZeroBatch replays (less the cases whose runs are noise), written as
    ``engine_<model>.toml`` (``contention = "overlap"`` at the calibrated share, where there is one) and
    ``engine_<model>_none.toml``; the whole fit with its intervals as ``fit_<model>.json``."""
    import copy

    from dvasim.errors import DvasimError
    from dvasim.fitting.check import is_noise, real_runs
    from dvasim.fitting.fit import fit, table_operators, write_engine
    from dvasim.reporting.result import strict_json

    every = [(ld, dirs) for (p, ld), dirs in sorted(cases.items()) if p == "zerobatch"]
    zb = [d for ld, dirs in every if not is_noise(real_runs(summary_json, "zerobatch", ld)["mean_latency_ms"])
          for d in dirs]
    note = {}
    if not every:
        return None, None, {"error": "no ZeroBatch replay finished"}
    if not zb:  # better a fit on noisy replays, said so, than none
        zb = [d for _, dirs in every for d in dirs]
        note = {"note": "every ZeroBatch case is noise (its replays' means differ by more than half their mean): "
                        "fitted on all of them"}
        log(f"fit {model}: {note['note']}")
    try:
        res = fit(zb, operators=table_operators(table), operators_source=f"{table.name}'s cuts",
                  n_boot=plan.bootstrap)
    except DvasimError as e:
        log(f"fit {model}: FAILED {e}")
        return None, None, {"error": str(e)}
    plan.summary.mkdir(parents=True, exist_ok=True)
    res["fit"]["folders"] = [os.path.relpath(d, plan.summary) for d in zb]  # (as the engine file's folder sees them)
    none = write_engine(res, plan.summary / f"engine_{model}_none.toml")
    over = copy.deepcopy(res)
    if cal is not None:
        over["engine"]["contention"] = "overlap"
        over["engine"]["contention_share"] = cal["share"]
    engine = write_engine(over, plan.summary / f"engine_{model}.toml")
    (plan.summary / f"fit_{model}.json").write_text(json.dumps(strict_json(res), indent=1, default=_json_num) + "\n")
    log(f"fit {model}: {len(zb)} ZeroBatch replays, {res['fit']['n_executions']} executions -> {engine.name}")
    return engine, none, {"folders": [str(Path(d).relative_to(plan.traces)) for d in zb], **note}


def score_model(plan: Plan, log: Log, model: str, cal: dict | None) -> tuple[list[dict], dict[str, Any]]:
    """Every case of ``model`` scored (:func:`dvasim.fitting.check.score_case`): ZeroBatch as ``fit`` (in-sample),
    the others ``predicted``; the errors with contention (``err_*``), without (``none_err_*``), the default
    engine's (``before_*``), the replays' run-to-run spread (``spread_*``: (max - min) / mean)."""
    from dvasim.fitting.check import score_case

    table = plan.traces / f"{model}_table.csv"
    summary_json, cases = real_summary(plan, model, table)
    engine, none, fitted = fit_model(plan, log, model, table, cases, summary_json, cal)
    rows = []
    for (policy, load), dirs in sorted(cases.items(), key=lambda kv: (POLICIES.index(kv[0][0]), kv[0][1])):
        row: dict[str, Any] = {"model": model, "policy": policy, "load": load, "n_runs": len(dirs),
                               "role": "fit" if policy == "zerobatch" else "predicted"}
        if engine is None:
            rows.append({**row, "verdict": "no fit"})
            continue
        got = score_case(dirs[0], table, engine, summary_json, policy, load)
        base = score_case(dirs[0], table, none, summary_json, policy, load)
        row.update({k: v for k, v in got.items() if not (k.startswith(("ok_", "real_")) or k.endswith("_runs"))})
        row["case"] = case_name(model, policy, load)
        for k in METRICS:
            runs = got[f"real_{k}_runs"]
            mean = sum(runs) / len(runs)
            row[f"real_{k}"] = mean
            row[f"spread_{k}"] = (max(runs) - min(runs)) / mean if len(runs) > 1 and mean else None
            row[f"none_err_{k}"] = base[f"err_{k}"]
            row[f"before_err_{k}"] = (got[f"before_{k}"] - mean) / mean if mean else None
        row["contention"] = f"overlap {cal['share']}" if cal else "none"
        rows.append(row)
    return rows, fitted


def counts(rows: list[dict], prefix: str = "err_") -> dict[str, Any]:
    """Over the scored predicted cases: how many within 15 / 25 / 5% (mean / p99 / throughput: all three, and each),
    how many within 5 / 10 / 3%, and the median absolute errors."""
    import numpy as np

    scored = [r for r in rows if r.get("role") == "predicted" and r.get("verdict") in ("within", "outside")]

    def within(r, tol) -> bool:
        return all(r.get(f"{prefix}{k}") is not None and abs(r[f"{prefix}{k}"]) <= tol[k] for k in METRICS)

    out: dict[str, Any] = {"scored": len(scored), "within_15_25_5": sum(within(r, TARGETS) for r in scored),
                           "within_5_10_3": sum(within(r, TIGHT) for r in scored)}
    for k in METRICS:
        errs = [abs(r[f"{prefix}{k}"]) for r in scored if r.get(f"{prefix}{k}") is not None]
        out[f"within_{k}"] = sum(e <= TARGETS[k] for e in errs)
        out[f"median_abs_{prefix}{k}"] = float(np.median(errs)) if errs else None
    return out


def noise_floor(rows: list[dict]) -> dict[str, Any]:
    """Cases with two or more replays whose half spread is within 5 / 10 / 3% (mean / p99 / throughput)."""
    two = [r for r in rows if r.get("n_runs", 0) > 1 and r.get("spread_mean_latency_ms") is not None]
    ok = [r for r in two if all(r[f"spread_{k}"] / 2 <= TIGHT[k] for k in METRICS)]
    return {"cases_with_repeats": len(two), "half_spread_within_5_10_3": len(ok)}


def analyse(plan: Plan, log: Log) -> dict[str, Any]:
    """Fit and predict from whatever the traces folder holds; writes the summary folder. No torch needed."""
    import pandas as pd

    from dvasim.reporting.result import strict_json

    plan.summary.mkdir(parents=True, exist_ok=True)
    cal = calibration(plan, log)
    if cal is not None:
        pd.DataFrame(cal["rows"]).to_csv(plan.summary / "calibration.csv", index=False)
    host_cal = host_calibration(plan, log)
    if host_cal is not None:
        pd.DataFrame(host_cal["rows"]).to_csv(plan.summary / "calibration_host.csv", index=False)
    rows, fits = [], {}
    for m in plan.models:
        if not (plan.traces / f"{m}_table.csv").is_file():
            continue
        try:
            got, fits[m] = score_model(plan, log, m, cal)
        except Exception as e:  # one model's failure leaves the others' summary
            log(f"analyse {m}: FAILED {type(e).__name__}: {e}")
            got, fits[m] = [], {"error": f"{type(e).__name__}: {e}"}
        rows += got
    steps = Log(plan).steps()
    result = {"traces": _rel(plan.traces), "environment": _last_environment(plan),
              "targets": {"within_15_25_5": "mean 15%, p99 25%, throughput 5%",
                          "within_5_10_3": "mean 5%, p99 10%, throughput 3%"},
              "contention": {k: v for k, v in (cal or {}).items() if k != "rows"} or None,
              "host_contention": None if host_cal is None else {"cores": host_cal["cores"],
                                                                "n_co_runs": len(host_cal["rows"])},
              "with_contention": counts(rows), "without_contention": counts(rows, "none_err_"),
              "default_engine": counts(rows, "before_err_"), "noise_floor": noise_floor(rows), "fits": fits,
              "skipped": [s["job"] for s in steps if s["status"] == "skipped"],
              "failed": {s["job"]: s.get("error") for s in steps if s["status"] == "failed"},
              "interrupted": [s["job"] for s in steps if s["status"] == "interrupted"],
              "hung": {s["job"]: s.get("limit_s") for s in steps if s["status"] in ("hung", "died")},
              "cases": rows}
    pd.DataFrame(rows).to_csv(plan.summary / "summary.csv", index=False)
    (plan.summary / "summary.json").write_text(json.dumps(strict_json(result), indent=1, default=_json_num) + "\n")
    (plan.summary / "summary.md").write_text(summary_markdown(result), encoding="utf-8")
    c = result["with_contention"]
    log(f"predicted {c['scored']} cases: {c['within_15_25_5']} within 15/25/5%, {c['within_5_10_3']} within "
        f"5/10/3% (mean/p99/throughput); summary in {_rel(plan.summary)}")
    return result


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


def _last_environment(plan: Plan) -> dict[str, Any] | None:
    p = plan.traces / "environment.json"
    return json.loads(p.read_text())["runs"][-1] if p.is_file() else None


def _pct(x) -> str:
    return "" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:+.1%}"


def summary_markdown(res: dict[str, Any]) -> str:
    """``summary.md``: the counts, the calibration and one line per case."""
    env = res["environment"] or {}
    lines = ["# GPU matrix: fit on ZeroBatch and the co-runs, predict DelayBatch and DVABatch", "",
             f"Traces: `{res['traces']}`; {env.get('gpu') or env.get('cpu')}, driver {env.get('driver')}, torch "
             f"{env.get('torch')}, CUDA {env.get('cuda')}, {env.get('date_utc')}. Written by "
             "`experiments/validation/gpu_matrix.py` (its docstring and `experiments/validation/gpu/README.md` say "
             "how).", ""]
    for name, key in (("contention (calibrated)", "with_contention"), ("no contention", "without_contention"),
                      ("default engine (GPU time only)", "default_engine")):
        c = res[key]
        med = ", ".join(f"{k.split('_err_')[-1]} {v:.1%}" for k, v in c.items() if k.startswith("median") and v is not None)
        lines.append(f"* {name}: {c['within_15_25_5']} of {c['scored']} predicted cases within 15 / 25 / 5% (mean / "
                     f"p99 / throughput), {c['within_5_10_3']} within 5 / 10 / 3%; median |error| {med or 'n/a'}")
    nf = res["noise_floor"]
    lines.append(f"* run-to-run: half the spread of the repeats within 5 / 10 / 3% in {nf['half_spread_within_5_10_3']}"
                 f" of {nf['cases_with_repeats']} cases")
    if res["contention"]:
        lines.append(f"* contention_share {res['contention']['share']} from {res['contention']['n_calibration_points']}"
                     f" batch-1 co-runs ({res['contention']['n_held_out']} held out: calibration.csv)")
    for what in ("skipped", "interrupted"):
        if res[what]:
            lines.append(f"* {what}: {', '.join(res[what])}")
    if res["failed"]:
        lines.append("* failed: " + "; ".join(f"{k} ({v})" for k, v in res["failed"].items()))
    if res.get("hung"):
        lines.append("* hung (the measuring process killed past the step's limit; the model's later GPU steps "
                     "skipped): " + "; ".join(f"{k} (limit {v} s)" for k, v in res["hung"].items()))
    lines += ["", "| case | role | runs | throughput | mean | p99 | spread thr / mean / p99 | no contention: mean / p99 "
              "| verdict |", "| --- | --- | ---: | ---: | ---: | ---: | --- | --- | --- |"]
    for r in res["cases"]:
        spread = " / ".join(f"{r[f'spread_{k}']:.1%}" if r.get(f"spread_{k}") is not None else "-"
                            for k in ("throughput_qps", "mean_latency_ms", "p99_latency_ms"))
        lines.append(f"| {r['model']} {r['policy']} {r['load']:g} | {r['role']} | {r['n_runs']} | "
                     f"{_pct(r.get('err_throughput_qps'))} | {_pct(r.get('err_mean_latency_ms'))} | "
                     f"{_pct(r.get('err_p99_latency_ms'))} | {spread} | {_pct(r.get('none_err_mean_latency_ms'))} / "
                     f"{_pct(r.get('none_err_p99_latency_ms'))} | {r.get('verdict')} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- provenance and packing
def write_readme(plan: Plan, log: Log) -> None:
    """The traces folder's ``README.md``: what was run, on what, and the files."""
    env = _last_environment(plan) or {}
    steps = log.steps()
    by = {st: [s["job"] for s in steps if s["status"] == st]
          for st in ("done", "skipped", "failed", "interrupted", "hung", "died")}
    git = env.get("dvasim") or {}
    commit = (f"commit {git['commit'][:10]}" + (" with local changes" if git.get("local_changes") else "")
              if git.get("commit") else git.get("note", "commit unknown"))
    machine = (f"{env.get('gpu') or env.get('cpu')}, driver {env.get('driver')}, {env.get('cpu_count')} host cores, "
               f"Python {env.get('python')}, torch {env.get('torch')}, CUDA {env.get('cuda')}, cuDNN "
               f"{env.get('cudnn')}, TF32 {env.get('tf32_matmul')}, started {env.get('date_utc')}, dvasim {commit}")
    what = (f"{', '.join(plan.models)} (cuts in `matrix.json`) under {', '.join(plan.policies)} at "
            f"{', '.join(f'{x:g}' for x in plan.loads)} of each model's ZeroBatch capacity (`matrix.json`: measured "
            f"by a saturation replay, `saturation_<model>/`, or the table's where that failed), {plan.repeats} "
            f"replays each, {plan.n_queries} Poisson queries (seed {SEED}; BERT: GLUE "
            f"RTE lengths), max batch {plan.max_batch}, 2 buffer pairs, stages as CUDA graphs (`[replay] modules = "
            f"\"cudagraph\"`; on the CPU the stand-in graphs), the policy deciding with the table profiled first. "
            f"Steps done: {len(by['done'])}; skipped (budget {plan.budget_s:g} s): {len(by['skipped'])}; failed: "
            f"{len(by['failed'])}; interrupted: {len(by['interrupted'])}"
            + "".join(f"; {st} (the measuring process killed or dead in it; its model's later GPU steps skipped): "
                      + ", ".join(by[st]) for st in ("hung", "died") if by[st]) + ".")
    text = f"""# GPU matrix traces: {_tag(plan)}

**Measured, not modelled.** Written by `experiments/validation/gpu_matrix.py` ({'tiny, ' if plan.tiny else ''}on
{plan.device}): {machine}. Every run's machine is in `environment.json`; every step, with its time and status, in
`progress.jsonl`; the log in `run.log`. Licence: measurements made by and for the dvasim project, free to use with
this note.

What was run: {what}

| file | what |
| --- | --- |
| `<model>_table.csv`, `.launch.csv` | the stages' GPU time as CUDA graph replays at every batch size (and length), and the host's launch cost of a graph (`dvasim.fitting.validate.gpu_stage_table`) |
| `matrix.json` | per model: cuts, simulated capacity, the rate of every load, DelayBatch's window, DVABatch's parameters |
| `<model>_<policy>_<load>/r<k>/config.toml` | the replayed config (simulate it with `[model] table = ../../<model>_table.csv`) |
| `.../r<k>/queries.csv.gz`, `executions.csv.gz` | the replay's per-query records and stage executions (as `dvasim replay` writes them) |
| `.../r<k>/summary.json`, `config.json` | the replay's summary (with `gpu_matrix`: planned and real time, interruption) and its config as run, with versions |
| `overlap_4threads.csv` | the co-runs: each stage's graph on its own thread and stream, against each alone (the calibration of `contention_share`) |
| `<model>_summary.json` | per case the replays' figures and the default engine's simulation (the format of `traces/h100_replays/`) |
"""
    if by["skipped"] or by["failed"]:
        text += "\nNot run: " + "; ".join([*(f"{j} (budget)" for j in by["skipped"]),
                                            *(f"{j} (failed)" for j in by["failed"])]) + ".\n"
    (plan.traces / "README.md").write_text(text, encoding="utf-8")


def _tag(plan: Plan) -> str:
    """The run's name: its traces folder's (``h100_2026-11-28``), or the folder above a folder named traces."""
    return plan.traces.parent.name if plan.traces.name == "traces" else plan.traces.name


def pack(plan: Plan, log: Log, quiet: bool = False) -> Path | None:
    """Everything written (the traces and the summary) as one ``gpu_matrix_<tag>.tar.gz`` in ``--out`` (paths
    relative to the repository root: unpack there), with ``summary.md`` and ``run.log`` beside it."""
    if plan.out is None:
        return None
    plan.out.mkdir(parents=True, exist_ok=True)
    dest = plan.out / f"gpu_matrix_{_tag(plan)}.tar.gz"
    tmp = plan.out / f"gpu_matrix_{_tag(plan)}.partial"
    with tarfile.open(tmp, "w:gz") as tar:
        for d in (plan.traces, plan.summary):
            if d.is_dir():
                tar.add(d, arcname=_rel(d).lstrip("/"), filter=lambda ti: None if ti.name.endswith(".partial") else ti)
    os.replace(tmp, dest)
    for f in (plan.summary / "summary.md", plan.traces / "run.log"):
        if f.is_file():
            shutil.copyfile(f, plan.out / f.name)
    mib = dest.stat().st_size / 2**20
    if not quiet or mib > 15:
        log(f"packed {dest} ({mib:.1f} MiB{'; over the device tool limit of 16 MiB a file' if mib > 16 else ''})")
    return dest


def main(argv: list[str] | None = None) -> int:
    from dvasim.errors import DvasimError

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser().parse_args(argv)
        if args.download_wheels:
            return download_wheels(Path(args.download_wheels))
        if args.wheels:
            install_missing(Path(args.wheels), argv)
        plan = make_plan(args)
        if not args.analyse:
            _check_device(plan)
    except (Usage, DvasimError) as e:
        print(f"gpu_matrix.py: error: {e}", file=sys.stderr)
        return 2
    log = Log(plan)
    log(f"gpu matrix on {plan.device}{' (tiny)' if plan.tiny else ''}"
        + (f" (measuring child {os.environ[CHILD]})" if os.environ.get(CHILD) else "")
        + (" (supervising)" if plan.supervise and not os.environ.get(CHILD) else "") + f": traces {_rel(plan.traces)}, summary "
        f"{_rel(plan.summary)}, budget {plan.budget_s:g} s" + (", analysis only" if args.analyse else ""))
    if plan.supervise and not os.environ.get(CHILD):
        return supervise(plan, log, argv)
    if not args.analyse:
        measure(plan, log)
    analyse(plan, log)
    pack(plan, log)
    log("done" + (f"; on a lent GPU (after make gpu-wheels): {DEVICE_COMMAND}" if plan.device == "cpu" else ""))
    return 0


def _check_device(plan: Plan) -> None:
    try:
        import torch
    except ImportError as e:
        raise Usage("torch", f"the replays need torch ({e}); pip install -e '.[replay]'") from None
    if plan.device == "cuda" and not torch.cuda.is_available():
        raise Usage("--cpu", "this machine has no CUDA GPU; give --cpu (with --tiny for the quick check), or run it "
                             "on a lent GPU (make gpu-matrix)")


if __name__ == "__main__":
    sys.exit(main())
