"""Smoke test of experiments/e2bird_figs13_14.py (E2bird's Figures 13 and 14) in its --quick mode."""

from __future__ import annotations

import numpy as np

from tests.test_experiments_smoke import load


def test_e2bird_figs13_14_quick(tmp_path):
    res = load("e2bird_figs13_14").main(["--quick", "--out", str(tmp_path)])
    caps, lat, per_query = res["fig14"], res["fig13"], res["fig13_queries"]
    for name in ("e2bird_fig14_capacity.csv", "e2bird_fig14_capacity.png", "e2bird_fig13_latency.csv",
                 "e2bird_fig13_queries.csv", "e2bird_fig13.png"):
        assert (tmp_path / name).is_file(), name
    systems = {"NO_Wait", "OPT_Wait", "Static", "N-Ebird", "E-Ebird"}
    assert set(caps.system) == systems and (caps.capacity_qps > 0).all()
    # Static pads every batch to 32: it can never serve more than OPT_Wait, which forms the same batches unpadded
    c = caps.set_index("system")["capacity_qps"]
    assert c["Static"] <= c["OPT_Wait"] * 1.1
    # every query of the diurnal load is there, once per system, with a finite latency
    assert len(per_query) == 5 * 100 and np.isfinite(per_query.latency_ms).all()
    # at low load OPT_Wait waits for its 30 ms timeout (unless 32 arrive first): N-Ebird runs each input at once
    low = lat[lat.phase == "low"].set_index("system")["mean_ms"]
    assert low["OPT_Wait"] > 25.0 and low["N-Ebird"] < low["OPT_Wait"] / 2
