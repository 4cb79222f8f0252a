"""The triton engine's tests: a one-stage table file (the real server's fixture, ``triton_env``, is in
tests/conftest.py)."""


def table_csv(path, latency) -> str:
    """A one-stage table file: ``latency(b)`` ms for batch sizes 1..8 (or 1..32 where given as a list)."""
    sizes = range(1, len(latency) + 1) if isinstance(latency, list) else range(1, 9)
    rows = [f"0,{b},{(latency[b - 1] if isinstance(latency, list) else latency(b)):.6f}" for b in sizes]
    path.write_text("# source: a hand-made test table\nstage,batch_size,latency_ms\n" + "\n".join(rows) + "\n")
    return str(path)
