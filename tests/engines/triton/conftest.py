"""The real Triton server for the triton engine's tests: found in ``.venv/triton`` (``make triton-env``, which
``make test`` runs). Where it is missing a test skips on a developer's machine and fails under CI (``CI`` set):
CI installs it, so a skip there would hide a broken install."""

import os

import pytest

from dvasim.engines.triton.server import TritonUnavailable, find_env


@pytest.fixture(scope="session")
def triton_env():
    try:
        return find_env()
    except TritonUnavailable as e:
        if os.environ.get("CI"):
            pytest.fail(f"the real Triton server is required under CI: {e}")
        pytest.skip(str(e))


def table_csv(path, latency) -> str:
    """A one-stage table file: ``latency(b)`` ms for batch sizes 1..8 (or 1..32 where given as a list)."""
    sizes = range(1, len(latency) + 1) if isinstance(latency, list) else range(1, 9)
    rows = [f"0,{b},{(latency[b - 1] if isinstance(latency, list) else latency(b)):.6f}" for b in sizes]
    path.write_text("# source: a hand-made test table\nstage,batch_size,latency_ms\n" + "\n".join(rows) + "\n")
    return str(path)
