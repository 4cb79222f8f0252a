"""What the optional compiled core (``make compiled``, mypyc) buys: the CPU time of ``dvasim.run`` pure against
compiled, on the cases of :mod:`bench_speed` (BERT-base, 4 stages, GLUE RTE lengths, the ``sat`` load) under
ZeroBatch, DelayBatch and DVABatch, on the GPU alone and on the ``triton-tensorrt`` stack.

A process imports one of the two, so each run is a fresh subprocess, pure and compiled in turn (the order
swapped every repeat), each timing one ``dvasim.run`` with ``time.process_time`` after a short warm-up run. Both
trees are temporary copies of this checkout's package: one left pure, one built with
``tools/compile_core.py``. Every compiled run's records must equal the pure run's, bit for bit (a digest of
every query's timestamps), or the benchmark stops.

    python benchmarks/bench_compiled.py [--queries N] [--repeats R] [--compare] [--json OUT.json]

``--compare`` also times ``dvasim compare --workers 1 --models resnet152`` once each way (CPU time of the
command and its children). Not a test: the numbers depend on the machine; the ratios are what to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))

from compile_core import copy_package  # noqa: E402

CASES = [(p, s) for s in ("gpu-only", "triton-tensorrt") for p in ("zerobatch", "delaybatch", "dvabatch")]

CHILD = """
import hashlib, json, sys, time
sys.path.insert(0, {bench!r})
sys.path.insert(0, {golden!r})
import numpy as np
from bench_speed import bert_config
from make_golden import frame_arrays
import dvasim
from dvasim.compiled import compiled_modules
policy, stack, n = {policy!r}, {stack!r}, {n}
dvasim.run(bert_config(policy, 300, "sat", stack))  # warm-up: imports, the model's table, caches
cfg = bert_config(policy, n, "sat", stack)
t0 = time.process_time()
res = dvasim.run(cfg)
cpu = time.process_time() - t0
h = hashlib.sha256()
for col, arr in sorted(frame_arrays(res.queries).items()):
    h.update(col.encode()); h.update(np.ascontiguousarray(arr).tobytes())
flags = compiled_modules()
print(json.dumps({{"cpu_s": cpu, "digest": h.hexdigest(), "compiled": sum(flags.values()), "of": len(flags),
                  "package": dvasim.__file__}}))
"""


def _child(root: Path, tmp: Path, policy: str, stack: str, n: int) -> dict:
    # a script file in the temporary folder, run from there: `python -c` or `-m` would put the working directory
    # first on the path, and from the checkout that imports the checkout's package, not the tree under test
    script = tmp / "child.py"
    script.write_text(CHILD.format(bench=str(REPO / "benchmarks"), golden=str(REPO / "tests" / "golden"),
                                   policy=policy, stack=stack, n=n))
    env = {**os.environ, "PYTHONPATH": str(root)}
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=tmp, check=False)
    if r.returncode:
        raise SystemExit(f"{policy} on {stack} under {root} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _compare_cpu(root: Path, out: Path) -> tuple[float, float]:
    """(CPU s of the command and its children, wall s) of ``dvasim compare --workers 1 --models resnet152``."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dvasim", "compare", "--workers", "1", "--models", "resnet152", "--out",
                    str(out)], env=env, cwd=out.parent, check=True, capture_output=True)  # not from the checkout
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queries", type=int, default=50_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--compare", action="store_true", help="also time `dvasim compare` (resnet152) each way")
    ap.add_argument("--json", help="also write the numbers to this JSON file")
    ap.add_argument("--compiled-root", type=Path, help="a tree already built (tools/compile_core.py --copy-to)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dvasim-bench-compiled-") as tmp:
        pure, compiled = copy_package(Path(tmp) / "pure"), Path(tmp) / "compiled"
        t0 = time.perf_counter()
        if args.compiled_root is None:
            subprocess.run([sys.executable, str(REPO / "tools" / "compile_core.py"), "--copy-to", str(compiled)],
                           check=True, capture_output=True)
        else:
            compiled = args.compiled_root.resolve()
        build_s = time.perf_counter() - t0
        print(f"built the compiled core in {build_s:.1f} s (MYPYC_OPT_LEVEL={os.environ.get('MYPYC_OPT_LEVEL', '3')})"
              f"; {args.queries:,} queries a run, {args.repeats} runs each way")
        rows = []
        for policy, stack in CASES:
            times: dict[str, list[float]] = {"pure": [], "compiled": []}
            for rep in range(args.repeats):
                order = (("pure", pure), ("compiled", compiled))
                got = {}
                for kind, root in order if rep % 2 == 0 else order[::-1]:
                    got[kind] = _child(root, Path(tmp), policy, stack, args.queries)
                    times[kind].append(got[kind]["cpu_s"])
                assert got["pure"]["compiled"] == 0 and got["compiled"]["compiled"] == got["compiled"]["of"], got
                assert Path(got["pure"]["package"]).is_relative_to(pure), got
                assert Path(got["compiled"]["package"]).is_relative_to(compiled), got
                if got["pure"]["digest"] != got["compiled"]["digest"]:
                    raise SystemExit(f"{policy} on {stack}: compiled records differ from pure")
            p, c = statistics.median(times["pure"]), statistics.median(times["compiled"])
            rows.append({"policy": policy, "stack": stack, "pure_cpu_s": times["pure"],
                         "compiled_cpu_s": times["compiled"], "ratio": p / c})
            print(f"{policy:>10} on {stack:<15}: pure {p:6.2f} s, compiled {c:6.2f} s CPU (medians): {p / c:4.2f}x"
                  "   records identical")
            sys.stdout.flush()
        result = {"queries": args.queries, "repeats": args.repeats, "build_s": build_s, "rows": rows}
        if args.compare:
            for kind, root in (("pure", pure), ("compiled", compiled)):
                cpu, wall = _compare_cpu(root, Path(tmp) / f"compare-{kind}")
                result[f"compare_{kind}"] = {"cpu_s": cpu, "wall_s": wall}
                print(f"dvasim compare --workers 1 --models resnet152, {kind}: {cpu:.1f} s CPU, {wall:.1f} s wall")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
