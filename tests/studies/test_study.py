"""The evaluation methodology's pieces: stepping levels, the peak bracket, reductions; and one small real peak."""

import numpy as np
import pandas as pd
import pytest

from dvasim.studies import evaluation as study


def test_level_stats_and_bracket():
    rates = np.repeat([100.0, 200.0, 400.0, 800.0], 100)
    lat = np.concatenate([np.full(100, 10.0), np.full(100, 50.0), np.full(100, 150.0), np.full(100, 900.0)])
    lat[150] = np.nan  # an unfinished query counts as infinitely late: it breaks its level's p99
    df = pd.DataFrame({"latency_ms": lat})
    lv = study.level_stats(df, rates, qos_ms=200.0)
    assert lv["within_qos"].tolist() == [True, False, True, False]
    assert lv["mean_latency_ms"].iloc[0] == pytest.approx(10.0)
    # a violation at a lower level caps the peak there, even if a higher level looks fine
    assert study.stepping_bracket(lv) == (100.0, 200.0)
    lv.loc[1, "within_qos"] = True
    assert study.stepping_bracket(lv) == (400.0, 800.0)


def test_reductions_sign_and_value():
    res = pd.DataFrame({"model": ["m"] * 3, "load": ["low"] * 3, "policy": list(study.POLICIES),
                        "mean_latency_ms": [10.0, 20.0, 5.0]})
    red = study.reductions(res)
    assert red["vs_zerobatch_%"].iloc[0] == pytest.approx(50.0)
    assert red["vs_delaybatch_%"].iloc[0] == pytest.approx(75.0)


def test_peak_throughput_of_a_saturating_model_is_near_capacity():
    # ResNet152 on the Titan RTX table saturates the GPU from batch 2 on: the peak under a 200 ms p99 must lie
    # below the best throughput the table allows (64 / T(64)) and above half of it
    from dvasim.model.catalog import resolve_model

    table = resolve_model({"name": "resnet152", "device": "titanrtx", "stages": 4}).table
    capacity = 64 / table.total(64) * 1000.0
    p = study.peak_throughput("resnet152", {"name": "zerobatch"}, refine=2, refine_queries=2000)
    assert 0.5 * capacity < p.peak_qps <= capacity
    lo, hi = p.bracket
    assert lo <= p.peak_qps <= hi and hi / lo < 1.2


# ----------------------------------------------------------------------------- variants and attribution
def _frame(rows):
    return pd.DataFrame([{"model": m, "load": ld, "policy": p, "mean_latency_ms": v} for m, ld, p, v in rows])


def test_attribution_shares_add_up_to_the_reduction():
    # a token model (with dva+input) and one without; round numbers so every share is known by hand
    tok = {"delaybatch": 20.0, "dva-multientry": 12.0, "dva+stretch": 13.0, "dva+split": 11.0, "dva+input": 9.0,
           "dvabatch": 8.0, "zerobatch-x2": 8.1, "delaybatch-x2": 15.0}
    img = {"delaybatch": 10.0, "dva-multientry": 6.0, "dva+stretch": 7.0, "dva+split": 5.0, "dvabatch": 5.5,
           "zerobatch-x2": 5.7, "delaybatch-x2": 5.0}
    rows = [("tok", "low", p, v) for p, v in tok.items()] + [("img", "high", p, v) for p, v in img.items()]
    # irregular values too, for the float sum
    rng = np.random.default_rng(0)
    odd = dict(zip(["delaybatch", "dva-multientry", "dva+stretch", "dva+split", "dva+input", "dvabatch"],
                   rng.uniform(1.0, 50.0, 6)))
    rows += [("tok", "medium", p, v) for p, v in odd.items()]
    att = study.attribution(_frame(rows)).set_index(["model", "load"])

    t = att.loc[("tok", "low")]
    assert t["reduction_%"] == pytest.approx(60.0)  # 1 - 8/20
    assert [t[c] for c in study.SHARE_COLUMNS] == pytest.approx([40.0, -5.0, 10.0, 10.0, 5.0])
    i = att.loc[("img", "high")]
    assert i["reduction_%"] == pytest.approx(45.0)
    assert np.isnan(i["share_input_pp"])  # no dva+input run: the rest starts from dva+split
    assert [i[c] for c in ("share_multientry_pp", "share_stretch_pp", "share_split_pp", "share_rest_pp")] == \
        pytest.approx([40.0, -10.0, 20.0, -5.0])
    for key in att.index:
        r = att.loc[key]
        assert np.nansum([r[c] for c in study.SHARE_COLUMNS]) == pytest.approx(r["reduction_%"], abs=1e-9)
    o = att.loc[("tok", "medium")]
    assert o["reduction_%"] == pytest.approx(100 * (1 - odd["dvabatch"] / odd["delaybatch"]))

    # two instances: within 2% of DVABatch (or below) counts as matching
    assert t["vs_zerobatch-x2_%"] == pytest.approx(100 * (8.1 - 8.0) / 8.1)
    assert bool(t["zerobatch-x2_matches"]) and not bool(t["delaybatch-x2_matches"]) and bool(t["x2_matches_or_beats"])
    assert not bool(i["zerobatch-x2_matches"])  # 5.7 > 1.02 x 5.5
    assert bool(i["delaybatch-x2_matches"]) and i["vs_delaybatch-x2_%"] == pytest.approx(-10.0)
    assert not bool(o["x2_matches_or_beats"])  # not run: no claim
    assert list(att.reset_index()["load"][att.reset_index()["model"] == "tok"]) == ["low", "medium"]


def test_attribution_share_is_nan_when_an_ablation_was_not_run():
    att = study.attribution(_frame([("m", "low", "delaybatch", 10.0), ("m", "low", "dva+stretch", 7.0),
                                    ("m", "low", "dvabatch", 6.0)])).iloc[0]
    assert att["reduction_%"] == pytest.approx(40.0)
    assert np.isnan(att["share_multientry_pp"]) and np.isnan(att["share_stretch_pp"])


def test_reductions_with_a_baseline_not_run():
    red = study.reductions(_frame([("m", "low", "delaybatch", 10.0), ("m", "low", "dvabatch", 5.0)]))
    assert red["vs_delaybatch_%"].iloc[0] == pytest.approx(50.0) and np.isnan(red["vs_zerobatch_%"].iloc[0])


WL = {"kind": "poisson", "rate_qps": 200.0, "n_queries": 60, "seed": 1}


def test_variant_configs_are_what_they_claim():
    labels = [v.label for v in study.VARIANTS]
    assert labels[:3] == list(study.POLICIES) and len(set(labels)) == len(labels)
    cfg = study.variant_config("zerobatch-x2", "linknet", 3.5, WL)
    assert cfg["engine"]["instances"] == 2 and cfg["policy"]["name"] == "zerobatch"
    assert "max_queue_delay_ms" not in cfg["policy"]
    cfg = study.variant_config("delaybatch-x2", "linknet", 3.5, WL)
    assert cfg["engine"]["instances"] == 2 and cfg["policy"] == {"name": "delaybatch", "max_batch_size": study.BS_MAX,
                                                                  "max_queue_delay_ms": 3.5}
    for label in ("zerobatch", "delaybatch", "dvabatch", "dvabatch-window", "dva-multientry", "dva+split"):
        assert study.variant_config(label, "linknet", 3.5, WL)["engine"].get("instances", 1) == 1
    assert study.variant_config("delaybatch", "linknet", 3.5, WL)["policy"]["max_queue_delay_ms"] == 3.5
    assert study.variant_config("dvabatch-window", "linknet", 3.5, WL)["policy"] == {
        "name": "dvabatch", "max_batch_size": study.BS_MAX, "max_queue_delay_ms": 3.5}
    assert "max_queue_delay_ms" not in study.variant_config("dvabatch", "linknet", 3.5, WL)["policy"]
    assert study.variant_config("dva-multientry", "linknet", 3.5, WL)["policy"]["policies"] == []
    assert study.variant_config("dva+input", "bert_base", 3.5, WL)["policy"]["policies"] == ["load", "operator",
                                                                                              "input"]
    # dva+input only where the table has a seq_len
    assert "dva+input" in [v.label for v in study.variants_for("bert_large")]
    assert "dva+input" not in [v.label for v in study.variants_for("linknet")]
    assert [v.label for v in study.variants_for("unet", ["dvabatch", "zerobatch", "dva+input"])] == \
        ["zerobatch", "dvabatch"]
    with pytest.raises(ValueError, match="allowed"):
        study.variants_for("unet", ["nope"])


def test_variants_resolve_through_dvasim_run():
    import dvasim

    r = dvasim.run(study.variant_config("dva+split", "linknet", 1.0, WL), progress=False)
    assert r.config["policy"]["policies"] == ["load", "operator"] and r.summary["n_completed"] == 60
    r = dvasim.run(study.variant_config("dva-multientry", "linknet", 1.0, WL), progress=False)
    assert r.config["policy"]["policies"] == [] and r.summary["n_stretch"] == r.summary["n_split"] == 0
    # the compare row: the variant's label as ``policy``, the new counters, the instances
    row = study._run_job(("linknet", "zerobatch-x2", 1.0, "low", 200.0, 60, 1, {"device": "titanrtx"}))
    assert row["policy"] == "zerobatch-x2" and row["policy_name"] == "zerobatch" and row["instances"] == 2
    for key in ("n_stretch_started", "mean_batches_in_flight", "n_split", "n_stretch"):
        assert key in row


def test_compare_rejects_an_unknown_policy_label_in_one_line(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "never"
    p = subprocess.run([sys.executable, "-m", "dvasim.cli", "compare", "--policies", "dvabatch,bogus", "--out",
                        str(out)], capture_output=True, text=True)
    assert p.returncode == 2 and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "--policies" in lines[0] and "'bogus'" in lines[0]
    assert all(v.label in lines[0] for v in study.VARIANTS)
    assert not out.exists()  # refused before any simulation


def test_palette_keys_every_variant_paper_policies_first():
    from dvasim.reporting.plots import PALETTE, policy_colours

    assert list(PALETTE)[:3] == list(study.POLICIES)
    assert all(v.label in PALETTE for v in study.VARIANTS)
    assert len(set(PALETTE.values())) == len(PALETTE)
    cols = policy_colours(["dvabatch", "other", "zerobatch"])
    assert list(cols) == ["zerobatch", "dvabatch", "other"] and cols["dvabatch"] == PALETTE["dvabatch"]


def test_peer_variants_keep_their_papers_defaults_and_are_not_run_unless_named():
    assert study.DEFAULT_LABELS == tuple(v.label for v in study.VARIANTS)
    assert not set(study.DEFAULT_LABELS) & {v.label for v in study.PEER_VARIANTS}
    assert [v.label for v in study.variants_for("linknet")] == [x for x in study.DEFAULT_LABELS if x != "dva+input"]
    # the study's batch limit (64) is not imposed: TF-Serving keeps E2bird's 32, Serial its 1
    assert study.variant_config("serial", "linknet", 3.5, WL)["policy"] == {"name": "serial"}
    rows = {label: study._run_job(("linknet", label, 3.5, "high", 2000.0, 400, 1, {"device": "titanrtx"}))
            for label in ("serial", "tfserving-nowait", "graphbatch", "lazybatch", "n-ebird", "e-ebird")}
    assert rows["serial"]["mean_exit_batch_size"] == 1.0 and rows["serial"]["policy_name"] == "serial"
    for r in rows.values():
        assert r["n_completed"] == r["n_queries"] == 400
    # under an overload every queued request leaves in one batch of up to 32 (NO_Wait), against Serial's 1
    assert 1.0 < rows["tfserving-nowait"]["mean_exit_batch_size"] <= 32.0
    assert rows["serial"]["mean_latency_ms"] > rows["tfserving-nowait"]["mean_latency_ms"]
    # each row is the named policy's run: E2bird's engine has one instance per worker (6 by default)
    assert {r["policy_name"] for r in rows.values()} == set(rows)
    assert rows["n-ebird"]["instances"] == 6 and rows["lazybatch"]["instances"] == 1


def test_compare_accepts_the_peer_names(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "c"
    p = subprocess.run([sys.executable, "-m", "dvasim", "compare", "--models", "linknet", "--policies",
                        "serial,tfserving-nowait,nonesuch", "--out", str(out)], capture_output=True, text=True)
    assert p.returncode == 2 and "'nonesuch'" in p.stderr
    assert all(v.label in p.stderr for v in study.PEER_VARIANTS)  # the allowed list names the peers
    assert not out.exists()
