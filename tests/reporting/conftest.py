"""Fixtures of the reporting tests."""

import matplotlib.pyplot as plt
import pytest


@pytest.fixture
def drawn(monkeypatch):
    """The figures the next calls save, drawn (so that text positions are known) before they are closed."""
    figs = []
    orig = plt.Figure.savefig

    def spy(fig, *a, **k):
        out = orig(fig, *a, **k)
        figs.append(fig)
        return out

    monkeypatch.setattr(plt.Figure, "savefig", spy)
    return figs
