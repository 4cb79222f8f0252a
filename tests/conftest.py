"""Shared fixtures: synthetic latency tables built with the real LatencyTable class."""

from __future__ import annotations

import itertools

import pandas as pd
import pytest

from dvasim.model.table import LatencyTable


def make_table(n_stages, fn, batch_sizes=range(1, 65), seq_lens=None, name="synthetic") -> LatencyTable:
    """A table whose latency at (stage, b[, L]) is ``fn(stage, b[, L])`` ms."""
    rows = []
    for s, b in itertools.product(range(n_stages), batch_sizes):
        if seq_lens is None:
            rows.append({"stage": s, "batch_size": b, "latency_ms": float(fn(s, b))})
        else:
            for L in seq_lens:
                rows.append({"stage": s, "batch_size": b, "seq_len": L, "latency_ms": float(fn(s, b, L))})
    return LatencyTable.from_frame(pd.DataFrame(rows), provenance={"source": "synthetic (tests)"}, name=name)


@pytest.fixture
def flat_table():
    """Four stages of 1 ms each, at any batch size up to 64 (every stage saturates only at 64)."""
    return make_table(4, lambda s, b: 1.0)


def vgg19_config_file(path, rate_qps: float, n_queries: int, seed: int, engine: str = ""):
    """A small TOML config (vgg19 in 2 stages, ZeroBatch up to 8, Poisson) for the replay CLI tests."""
    path.write_text(f"""
[model]
name = "vgg19"
device = "cpu"
stages = 2
[policy]
name = "zerobatch"
max_batch_size = 8
[workload]
kind = "poisson"
rate_qps = {rate_qps}
n_queries = {n_queries}
seed = {seed}
{engine}""")
    return path


def random_cost_table(rng, n_stages: int, top: int = 8) -> LatencyTable:
    """A random table for property tests: batch sizes 1..``top``, each stage time a random base times a random
    batching gain (from none to strong), drawn from ``rng`` (a :class:`random.Random`)."""
    costs = {(s, b): rng.uniform(0.05, 2.0) * (1 + b / rng.choice([1, 4, 16])) for s in range(n_stages)
             for b in range(1, top + 1)}
    return make_table(n_stages, lambda s, b: costs[(s, b)], batch_sizes=range(1, top + 1))



@pytest.fixture(scope="session")
def triton_env():
    """The real Triton server's environment (``.venv/triton``: ``make triton-env``, which ``make test`` runs).
    Where it is missing a test skips on a developer's machine and fails under CI (``CI`` set): CI installs it, so a
    skip there would hide a broken install."""
    import os

    from dvasim.engines.triton.server import TritonUnavailable, find_env

    try:
        return find_env()
    except TritonUnavailable as e:
        if os.environ.get("CI"):
            pytest.fail(f"the real Triton server is required under CI: {e}")
        pytest.skip(str(e))
