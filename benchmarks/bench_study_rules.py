"""The wall time of the README's ``capacity`` and ``plan`` examples under the probe rules before issue 34 and after.

Before: the package as it was at commit 22f9773 (the last before issue 34's probe rules; a git worktree of it is
made in a temporary folder): probes of 1,000 queries doubling to 64,000 at 95% confidence, no minimum duration, no
trigger test, one short confirming run, searches one after another. After: the defaults (probes of at least 60 s
of arrivals, LoadGen's early-stopping bound at 99%, a backlog trigger for every accepted rate, the answer's 10x
long-run confirmation: ``capacity`` steps its rate down while a long run fails, ``plan`` its count), independent
searches on one process per core. The two rules answer differently (the point of issue 34); this
measures what the longer probes cost and what the processes win back. Each command runs in a fresh interpreter
(``python -m dvasim``), as a user runs it; the core it ran on (compiled or pure) is said.

    python benchmarks/bench_study_rules.py [--json OUT.json] [--only capacity|plan]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEFORE = "22f9773"  # the last commit before issue 34's probe rules
EXAMPLES = {
    "capacity": ["capacity", "configs/default.toml", "--slo-ms", "200", "--seeds", "3"],
    "plan": ["plan", "configs/default.toml", "--qps", "600", "--slo-ms", "200", "--seeds", "3", "--quiet"],
}


def timed(args: list[str], tree: Path) -> tuple[float, float, str]:
    """(wall s, CPU s of the command and its workers, the answer's first line) of ``python -m dvasim ARGS`` run
    from the package in ``tree``."""
    before = os.times()
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with tempfile.TemporaryDirectory() as out:
        p = subprocess.run([sys.executable, "-m", "dvasim", *args, "--out", out], cwd=tree, capture_output=True,
                           text=True, check=True, env=env)
    wall = time.perf_counter() - t0
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    lines = [ln for ln in p.stdout.strip().splitlines() if ln.startswith("dvasim ")]
    return wall, cpu, lines[0] if lines else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="also write the numbers to this JSON file")
    ap.add_argument("--only", choices=tuple(EXAMPLES))
    args = ap.parse_args()
    from dvasim.compiled import compiled_modules

    core = "compiled" if all(compiled_modules().values()) else "pure"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(old), BEFORE], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            for name, cmd in EXAMPLES.items():
                if args.only and name != args.only:
                    continue
                for rule, tree in ((f"before ({BEFORE})", old), ("after", ROOT)):
                    wall, cpu, line = timed(cmd, tree)
                    rows.append({"example": " ".join(cmd), "rule": rule, "wall_s": round(wall, 1),
                                 "cpu_s": round(cpu, 1), "core": core if tree == ROOT else "pure",
                                 "cores": os.cpu_count(), "answer": line})
                    print(f"{name:8} {rule:18} wall {wall:7.1f} s  cpu {cpu:7.1f} s  [{rows[-1]['core']} core]  "
                          f"{line[:100]}", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, capture_output=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
