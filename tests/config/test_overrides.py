"""--set (issue 13): a key, a whole section (a change of its shape), or no value to unset a key."""

from __future__ import annotations

from pathlib import Path

import pytest

import dvasim
from dvasim.cli import main
from dvasim.config import apply_overrides, parse_override
from dvasim.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "configs/default.toml"


def test_a_whole_section_can_be_replaced_to_change_its_shape():
    r = dvasim.run(DEFAULT, overrides=['workload={kind = "stepping", start_qps = 50, end_qps = 400, '
                                       'step_queries = 100, n_queries = 400}', "engine.progress=false"])
    assert r.config["workload"]["kind"] == "stepping" and "rate_qps" not in r.config["workload"]
    assert r.summary["n_queries"] == 400 and len(r.summary["levels"]) == 4
    # the same change with a key at a time fails: poisson's rate_qps is not a stepping key
    with pytest.raises(ConfigError) as e:
        dvasim.run(DEFAULT, overrides=['workload.kind="stepping"'])
    assert e.value.field == "workload.rate_qps"


def test_a_key_without_a_value_is_unset():
    raw = {"policy": {"name": "delaybatch", "max_queue_delay_ms": 10.0}, "engine": {"host": {"cores": 4}}}
    out = apply_overrides(raw, ["policy.max_queue_delay_ms", "engine.host.cores", "policy.not_there"])
    assert out == {"policy": {"name": "delaybatch"}, "engine": {"host": {}}}
    assert raw["policy"]["max_queue_delay_ms"] == 10.0  # the input is not changed
    r = dvasim.run(DEFAULT, overrides=["policy.max_queue_delay_ms", "workload.n_queries=200"])
    assert r.config["policy"]["max_queue_delay_ms"] == 5.0  # delaybatch's default window again


@pytest.mark.parametrize("text,field", [("workload=5", "--set workload"), ("nosuch={a = 1}", "nosuch"),
                                        ("policy", "--set"), ("=3", "--set")])
def test_bad_overrides_name_the_field(text, field, tmp_path, capsys):
    with pytest.raises(ConfigError) as e:
        apply_overrides({}, [text])
    assert e.value.field == field
    assert main(["run", str(DEFAULT), "--out", str(tmp_path / "o"), "--set", text]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and field in err and not (tmp_path / "o").exists()


def test_parse_override_keeps_strings_and_reads_toml():
    assert parse_override("policy.name=zerobatch") == ("policy", "name", "zerobatch")
    assert parse_override("engine.cores=4") == ("engine", "cores", 4)
    assert parse_override('model={name = "vgg19", stages = 2}') == ("model", None, {"name": "vgg19", "stages": 2})
