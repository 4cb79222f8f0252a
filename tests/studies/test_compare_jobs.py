"""``compare`` runs its study as jobs that start as soon as what they need is known (a model's window tuning,
then DelayBatch's peak with the tuned window, then the runs at fractions of that peak; DVABatch's peaks need
nothing), on one pool of processes. Whatever order the jobs finish in, the rows and the calibration are those of
the study run in order in one process. The jobs here are stand-ins (the real ones are checked byte for byte by
``make run``'s outputs): each answers from its arguments alone, after a pause that shuffles the finishing order."""

from __future__ import annotations

import time
import zlib

import pandas as pd

import dvasim.studies.evaluation as ev


def _digest(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def fake_peak(job):
    model, policy, kw = job
    h = _digest(model, sorted(policy.items()), sorted(kw.items()))
    time.sleep((h % 7) / 1000)
    peak = 50.0 + h % 400
    return peak, (peak, peak * 1.1 if h % 5 else float("inf"))


def fake_run(job):
    model, label, window, load, rate, n_queries, seed, _kw = job
    time.sleep((_digest(model, label, load) % 5) / 1000)
    return {"model": model, "policy": label, "load": load, "window": window, "offered_qps": rate, "seed": seed}


def _study(monkeypatch, workers):
    monkeypatch.setattr(ev, "_peak_job", fake_peak)
    monkeypatch.setattr(ev, "_run_job", fake_run)
    return ev.compare(["vgg19", "resnet152", "bert_base"], policies=["zerobatch", "delaybatch", "dvabatch"],
                      workers=workers, progress=False, seeds=2, n_queries=100)


def test_the_jobs_in_processes_give_the_study_run_in_order(monkeypatch):
    (rows1, calib1), (rows2, calib2) = _study(monkeypatch, 1), _study(monkeypatch, 2)
    pd.testing.assert_frame_equal(rows1, rows2)
    pd.testing.assert_frame_equal(calib1, calib2)
    assert calib1.attrs["peak_at_ladder_top"] == calib2.attrs["peak_at_ladder_top"]
    assert rows1.attrs["by_seed"] == rows2.attrs["by_seed"]
    # every model's window is the candidate with the highest peak (ties: the smaller), and its runs are at the
    # loads' fractions of DelayBatch's peak with that window
    for _, c in calib1.iterrows():
        kw = {"device": "titanrtx", "stages": 1, "refine": 2} if ev.VARIANT_BY_LABEL["delaybatch"].whole else \
            {"device": "titanrtx", "refine": 2}
        tried = {w: fake_peak((c.model, {"name": "delaybatch", "max_queue_delay_ms": w}, kw))[0]
                 for w in ev.window_candidates(c.model)}
        assert c.delaybatch_window_ms == min(tried, key=lambda w: (-tried[w], w))
        runs = [r for r in rows1.attrs["by_seed"] if r["model"] == c.model]
        assert {r["window"] for r in runs} == {c.delaybatch_window_ms}
        assert sorted({r["offered_qps"] for r in runs}) == sorted(f * c.peak_qps_delaybatch for f in ev.LOADS.values())
    # the rows keep the study's order: model, then load, then variant
    assert list(rows1["model"]) == [m for m in ["vgg19", "resnet152", "bert_base"] for _ in range(9)]
