"""Peak memory and wall time of one long run: ``dvasim run`` with ``n_queries`` queries (default 10 million) on the
default config, its records streamed to ``queries.parquet``.

Runs the CLI in a child process and reports the child's peak resident memory (``ru_maxrss``), its wall time, the
simulated queries per second and the size of what it wrote. Not a test: the numbers depend on the machine.

    python benchmarks/bench_memory.py [--queries N] [--out DIR]     (make bench-10m)
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queries", type=int, default=10_000_000)
    ap.add_argument("--out", help="output folder (default: a temporary one, removed afterwards)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp) / "run"
        cmd = [sys.executable, "-m", "dvasim", "run", str(ROOT / "configs/default.toml"), "--out", str(out),
               "--set", f"workload.n_queries={args.queries}", "--set", "engine.progress=false"]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        summary = json.loads((out / "summary.json").read_text())
        sizes = {p.name: p.stat().st_size for p in out.iterdir()}
    print(f"{args.queries:,} queries: {wall:.1f} s wall, peak memory {peak_mib:,.0f} MiB, "
          f"{summary['n_completed']:,} completed, engine {summary['sim_queries_per_wall_s']:,.0f} q/s")
    for name, size in sorted(sizes.items()):
        print(f"  {name:<16} {size / 2**20:10.1f} MiB")


if __name__ == "__main__":
    main()
