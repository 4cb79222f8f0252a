"""An engine file pins the choices it was fitted under (issue 46, item 3; :mod:`dvasim.config.pins`): ``dvasim fit``
writes them as ``[pinned]``, a run applies them where its config is silent and refuses one that says otherwise
in one line naming the key, and an engine file written before pinning merges exactly as before."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pandas as pd
import pytest
import tomllib

from dvasim.api import run
from dvasim.cli import main
from dvasim.config import apply_engine_file
from dvasim.errors import ConfigError
from dvasim.fitting.check import case_config, score_case

ROOT = Path(__file__).parents[2]
DATA = ROOT / "tests" / "data" / "h100_replays"
H100 = ROOT / "experiments" / "h100_fit"
BERT_TABLE = DATA / "bert_base_serving_table.csv"


@pytest.fixture(scope="module")
def pinned_engine(tmp_path_factory) -> Path:
    """``dvasim fit`` on the BERT-base ZeroBatch test replays at the serving table's cut (``--table``)."""
    out = tmp_path_factory.mktemp("pins") / "engine.toml"
    dirs = [str(DATA / f"bert_base_zerobatch_{x}") for x in ("0.6", "0.85")]
    assert main(["fit", *dirs, "--table", str(BERT_TABLE), "--bootstrap", "0", "--out", str(out)]) == 0
    return out


def unpinned(engine: Path, dest: Path) -> Path:
    """The engine file less its ``[pinned]`` tables: what dvasim fit wrote before issue 46."""
    text = re.sub(r"(?ms)^# the choices this file.*?(?=^\[fit\])", "", engine.read_text())
    dest.write_text(text)
    assert "pinned" not in tomllib.loads(text)
    return dest


def dvabatch_case() -> dict:
    """The BERT-base DVABatch 0.3 replay's config on its serving table, Policy I's cost left to the default."""
    cfg = case_config(DATA / "bert_base_dvabatch_0.3", BERT_TABLE)
    cfg["policy"].pop("cluster_host_cost")
    cfg["workload"]["n_queries"] = 300
    return cfg


def test_fit_writes_the_pins(pinned_engine):
    data = tomllib.loads(pinned_engine.read_text())
    assert data["pinned"] == {
        "policy": {"cluster_host_cost": False},
        "engine": {"host": {"copy_lock": "fixed", "launch_scale": 1.0}},
        "model": {"name": "bert_base", "cuts": [0, 15, 31, 47], "operators": 62},
    }
    assert data["engine"]["host"]["stage_operators"] == [15, 16, 16, 15]  # the same cut the law was fitted through


def test_a_run_applies_the_pins(pinned_engine, tmp_path):
    cfg = dvabatch_case()
    merged = apply_engine_file(cfg, pinned_engine)
    assert merged["policy"]["cluster_host_cost"] is False
    assert merged["engine"]["host"]["copy_lock"] == "fixed" and merged["engine"]["host"]["launch_scale"] == 1.0
    # the pinned run is the unpinned file's run with the fitted choices written into the config
    old = unpinned(pinned_engine, tmp_path / "old.toml")
    explicit = copy.deepcopy(cfg)
    explicit["policy"]["cluster_host_cost"] = False
    a = run(cfg, engine=pinned_engine, progress=False).summary
    b = run(explicit, engine=old, progress=False).summary
    c = run(cfg, engine=old, progress=False).summary  # today's default (true): another run
    for k in ("throughput_qps", "mean_latency_ms", "p99_latency_ms"):
        assert a[k] == b[k]
    assert a["mean_latency_ms"] != c["mean_latency_ms"]


def test_a_zoo_model_without_a_cut_runs_at_the_fitted_cut(pinned_engine):
    raw = {"model": {"name": "bert_base", "device": "h100", "stages": 4}, "policy": {"name": "zerobatch"}}
    merged = apply_engine_file(raw, pinned_engine)
    assert merged["model"] == {"name": "bert_base", "device": "h100", "cuts": [0, 15, 31, 47]}
    assert "cluster_host_cost" not in merged["policy"]  # ZeroBatch takes no such parameter
    for other in ({"stages": 2}, {"cuts": [0, 20, 40, 50]}):  # another cut: the launch law, as before
        raw2 = {"model": {"name": "bert_base", "device": "h100", **other}}
        assert apply_engine_file(raw2, pinned_engine)["model"] == raw2["model"]
    raw3 = {"model": {"name": "resnet152", "device": "h100", "stages": 4}}  # another model: not this file's cut
    assert apply_engine_file(raw3, pinned_engine)["model"] == raw3["model"]


@pytest.mark.parametrize("section,key,value", [("policy", "cluster_host_cost", True),
                                               ("engine.host", "copy_lock", "all"),
                                               ("engine.host", "launch_scale", 2.0)])
def test_a_contradicting_config_is_refused_in_one_line(pinned_engine, tmp_path, capsys, section, key, value):
    cfg = dvabatch_case()
    if section == "policy":
        cfg["policy"][key] = value
    else:
        cfg.setdefault("engine", {}).setdefault("host", {})[key] = value
    with pytest.raises(ConfigError) as e:
        apply_engine_file(cfg, pinned_engine)
    assert e.value.field == f"{section}.{key}" and "[pinned]" in e.value.message
    # the command line: one line naming the key, exit status 2, nothing written
    path = tmp_path / "case.toml"
    path.write_text(toml_text({k: v for k, v in cfg.items() if not k.startswith("_")}))
    capsys.readouterr()
    assert main(["run", str(path), "--engine", str(pinned_engine), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{section}.{key}" in err[0] and "[pinned]" in err[0]
    assert not (tmp_path / "out").exists()


def test_a_pin_this_dvasim_does_not_know_is_refused(pinned_engine, tmp_path):
    bad = tmp_path / "future.toml"
    bad.write_text(pinned_engine.read_text().replace("[pinned.policy]", "[pinned.policy]\nnew_choice = 1"))
    with pytest.raises(ConfigError, match="new_choice is not a choice this dvasim can pin") as e:
        apply_engine_file(dvabatch_case(), bad)
    assert e.value.field == "--engine"


def test_a_zoo_that_counts_other_operators_is_refused(pinned_engine, tmp_path):
    bad = tmp_path / "other_zoo.toml"
    bad.write_text(pinned_engine.read_text().replace("operators = 62", "operators = 70"))
    with pytest.raises(ConfigError, match="zoo counts 62") as e:
        apply_engine_file({"model": {"name": "bert_base", "device": "h100"}}, bad)
    assert e.value.field == "model.cuts"


def test_an_engine_file_without_pins_merges_and_runs_as_before():
    """The committed H100 engine files predate pinning: merged as before (no policy key, no cut, no host key
    added) and the recorded case scores the numbers in results.csv."""
    old = H100 / "engine_resnet152.toml"
    assert "pinned" not in tomllib.loads(old.read_text())
    raw = {"model": {"name": "resnet152", "device": "h100", "stages": 4},
           "policy": {"name": "dvabatch"}, "engine": {"buffer_pairs": 2, "host": {"cores": 3}}}
    merged = apply_engine_file(raw, old)
    file_engine = tomllib.loads(old.read_text())["engine"]
    assert merged["model"] == raw["model"] and merged["policy"] == raw["policy"]
    assert merged["engine"] == {**raw["engine"], **file_engine, "host": {"cores": 3, **file_engine["host"]}}
    rep = ROOT / "traces" / "h100_replays"
    row = score_case(rep / "resnet152_dvabatch_0.6", rep / "resnet152_serving_table.csv", old,
                     rep / "resnet152_summary.json", "dvabatch", 0.6)
    rec = pd.read_csv(H100 / "results.csv").set_index("case").loc["resnet152_dvabatch_0.6"]
    for k in ("throughput_qps", "mean_latency_ms", "p99_latency_ms"):
        assert row[f"sim_{k}"] == pytest.approx(rec[f"sim_{k}"], rel=1e-12)


def toml_text(cfg: dict) -> str:
    from dvasim.fitting.fit import toml_value

    lines = []
    for name, sec in cfg.items():
        subs = {k: v for k, v in sec.items() if isinstance(v, dict)}
        lines += [f"[{name}]"] + [f"{k} = {toml_value(v)}" for k, v in sec.items() if k not in subs]
        for sub, vals in subs.items():
            lines += [f"[{name}.{sub}]"] + [f"{k} = {toml_value(v)}" for k, v in vals.items()]
    return "\n".join(lines) + "\n"
