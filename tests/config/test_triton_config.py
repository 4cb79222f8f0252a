"""Triton model configurations in (issue 24, item 4): ``[policy] triton_config`` / ``dvasim run --triton-config``
parsed with protobuf's text format into Triton's own ``inference.ModelConfig`` (built from the shipped descriptor
set), mapped to the ``"triton"`` policy and ``[engine] instances``, with Triton's own validation rules
(model_config_utils.cc) and one-line errors naming the file, the line and the field."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import dvasim
from dvasim.cli import main
from dvasim.config import resolve
from dvasim.config.triton import DATA_DIR, model_config_class, read_model_config, triton_settings
from dvasim.errors import ConfigError
from dvasim.workload.config import priority_draws, workload_from_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "configs" / "triton"

# every field the simulator reads, as a real config writes them
EVERY_FIELD = """
name: "every_field"
platform: "tensorrt_plan"
max_batch_size: 16
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]
dynamic_batching {
  preferred_batch_size: [ 8, 4 ]
  max_queue_delay_microseconds: 2500
  priority_levels: 3
  default_priority_level: 2
  default_queue_policy {
    max_queue_size: 12
    timeout_action: DELAY
    default_timeout_microseconds: 40000
    allow_timeout_override: true
  }
  priority_queue_policy { key: 1 value { max_queue_size: 4 default_timeout_microseconds: 7000 } }
  priority_queue_policy [ { key: 3 value { timeout_action: REJECT } } ]
}
instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0 ] }, { count: 1 kind: KIND_GPU } ]
"""


def pbtxt(tmp_path, text, name="config.pbtxt") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_the_descriptor_set_holds_tritons_model_config_with_every_field_read():
    cls = model_config_class()
    d = cls.DESCRIPTOR
    assert d.full_name == "inference.ModelConfig"
    assert {"max_batch_size", "dynamic_batching", "instance_group", "sequence_batching"} <= set(d.fields_by_name)
    db = d.fields_by_name["dynamic_batching"].message_type
    assert {"preferred_batch_size", "max_queue_delay_microseconds", "priority_levels", "default_priority_level",
            "default_queue_policy", "priority_queue_policy"} <= set(db.fields_by_name)
    qp = db.fields_by_name["default_queue_policy"].message_type
    assert set(qp.fields_by_name) >= {"max_queue_size", "timeout_action", "default_timeout_microseconds",
                                      "allow_timeout_override"}
    assert (DATA_DIR / "model_config.proto").read_text().startswith("// Copyright 2018-2026, NVIDIA")
    assert "83adf7cf88a2f343005974dff3728be746de2d66" in (DATA_DIR / "PROVENANCE.md").read_text()


def test_every_field_is_read_with_tritons_units_and_defaults(tmp_path):
    params, instances = triton_settings(pbtxt(tmp_path, EVERY_FIELD))
    assert instances == 3
    assert params == {
        "name": "triton", "max_batch_size": 16, "preferred_batch_size": [4, 8], "max_queue_delay_ms": 2.5,
        "max_queue_size": 12, "timeout_action": "DELAY", "default_timeout_ms": 40.0, "allow_timeout_override": True,
        "priority_levels": 3, "default_priority_level": 2,
        # a level's own policy is a whole ModelQueuePolicy: its absent fields take the proto's defaults
        "priority_queue_policy": {
            1: {"max_queue_size": 4, "timeout_action": "REJECT", "default_timeout_ms": 7.0,
                "allow_timeout_override": False},
            3: {"max_queue_size": 0, "timeout_action": "REJECT", "default_timeout_ms": 0.0,
                "allow_timeout_override": False}},
        "triton_config": str((tmp_path / "config.pbtxt").resolve())}


def test_the_shipped_examples_read_as_their_comments_say():
    bert, n = triton_settings(EXAMPLES / "bert_base.pbtxt")
    assert n == 2 and bert["max_batch_size"] == 16 and bert["preferred_batch_size"] == [8, 16]
    assert (bert["max_queue_delay_ms"], bert["max_queue_size"], bert["default_timeout_ms"]) == (1.0, 32, 100.0)
    resnet, n = triton_settings(EXAMPLES / "resnet152.pbtxt")
    assert n == 1 and resnet["priority_levels"] == 2 and resnet["default_priority_level"] == 2
    assert resnet["timeout_action"] == "DELAY" and resnet["priority_queue_policy"][2]["timeout_action"] == "REJECT"
    for f in ("bert_base.pbtxt", "resnet152.pbtxt"):
        assert "Source:" in (EXAMPLES / f).read_text().split("\nname:")[0]


def test_no_dynamic_batching_is_tritons_default_scheduler(tmp_path):
    params, n = triton_settings(pbtxt(tmp_path, 'max_batch_size: 8\ninstance_group { count: 3 }'))
    assert params["dynamic_batching"] is False and n == 3
    params, _ = triton_settings(pbtxt(tmp_path, "max_batch_size: 0\ndynamic_batching { }"))
    assert params["max_batch_size"] == 1  # a model that does not batch: each request alone


@pytest.mark.parametrize("text,where", [
    ("max_batch_size 8", ":1:16: 'max_batch_size 8': Expected \":\""),  # a syntax error, with its line
    ("max_batch_size: 8\nmax_batch_sise: 4", ":2:1: Message type \"inference.ModelConfig\" has no field named "
                                             "\"max_batch_sise\""),  # an unknown field, named
    ('max_batch_size: "eight"', ":1:17: 'max_batch_size: \"eight\"': Couldn't parse integer"),  # a wrong type
    ("dynamic_batching {\n default_queue_policy { timeout_action: LATER } }",
     ":2:41: ' default_queue_policy { timeout_action: LATER } }': Enum type"),  # a bad enum value
    ("max_batch_size: 99999999999", "Value out of range"),
])
def test_parse_errors_are_one_line_naming_the_file_line_and_field(tmp_path, text, where):
    p = pbtxt(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        read_model_config(p)
    msg = str(e.value)
    assert e.value.field == "policy.triton_config" and "\n" not in msg
    assert f"{p}{where}" in msg if where.startswith(":") else where in msg


@pytest.mark.parametrize("text,words", [
    ("max_batch_size: 8\ndynamic_batching { preferred_batch_size: [ 16 ] }", "preferred_batch_size 16 must be in"),
    ("max_batch_size: 8\ndynamic_batching { priority_levels: 2 }", "default_priority_level must be in 1..2"),
    ("max_batch_size: 8\ndynamic_batching { priority_levels: 2 default_priority_level: 1 "
     "priority_queue_policy { key: 3 value { } } }", "priority_queue_policy key 3"),
    ("max_batch_size: -1", "max_batch_size must be >= 0"),
    ("max_batch_size: 8\nsequence_batching { }", "sequence_batching is not simulated"),
    ("max_batch_size: 8\ninstance_group [ { count: 1 gpus: [ 0, 1 ] } ]", "instance_group[0].gpus"),
    ("max_batch_size: 8\ninstance_group [ { kind: KIND_GPU }, { kind: KIND_CPU } ]", "instance_group[1].kind"),
    ("max_batch_size: 8\ninstance_group [ { count: 2 passive: true } ]", "every instance_group is passive"),
    ("max_batch_size: 8\ninstance_group [ { count: 65 } ]", "at most 64"),
])
def test_configs_triton_refuses_are_refused_in_one_line(tmp_path, text, words):
    with pytest.raises(ConfigError) as e:
        triton_settings(pbtxt(tmp_path, text))
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("groups,want", [
    ("[ { count: 2 kind: KIND_GPU }, { count: 3 kind: KIND_AUTO } ]", 5),  # the sum of the counts
    ("[ { kind: KIND_GPU } ]", 1),  # a GPU group without a count: 1 (SetDefaultInstanceCount)
    ("[ { count: 2 }, { count: 4 passive: true } ]", 2),  # passive instances receive no requests
    ("[ { count: 1 gpus: [ 0 ] }, { count: 2 gpus: [ 0 ] } ]", 3),  # groups on the same GPU
])
def test_instance_group_counts(tmp_path, groups, want):
    assert triton_settings(pbtxt(tmp_path, f"max_batch_size: 8\ninstance_group {groups}"))[1] == want


def test_cpu_groups_without_a_count_follow_the_backends_default(tmp_path):
    # KIND_CPU without a count: 2 for onnxruntime and tensorflow backends, else 1 (SetDefaultInstanceCount)
    for platform, want in (("onnxruntime_onnx", 2), ("tensorflow_savedmodel", 2), ("pytorch_libtorch", 1)):
        text = f'platform: "{platform}"\nmax_batch_size: 8\ninstance_group [ {{ kind: KIND_CPU }} ]'
        assert triton_settings(pbtxt(tmp_path, text))[1] == want


def test_the_file_is_found_next_to_the_config_and_sets_policy_and_instances(tmp_path):
    (tmp_path / "sub").mkdir()
    pbtxt(tmp_path / "sub", EVERY_FIELD, "model.pbtxt")
    toml = tmp_path / "sub" / "run.toml"
    toml.write_text('[model]\nname = "resnet152"\ndevice = "titanrtx"\nstages = 1\n[policy]\n'
                    'triton_config = "model.pbtxt"\n[workload]\nkind = "poisson"\nrate_qps = 100\nn_queries = 50\n')
    cfg = resolve(toml)
    assert cfg["policy"]["name"] == "triton" and cfg["engine"]["instances"] == 3
    assert cfg["policy"]["triton_config"] == str((tmp_path / "sub" / "model.pbtxt").resolve())
    assert resolve(cfg) == cfg  # a resolved config resolves to itself (its values agree with the file)
    # values given next to the file must agree with it
    assert resolve(toml, ["policy.max_queue_delay_ms=2.5", "engine.instances=3", 'policy.name="triton"',
                          "policy.preferred_batch_size=[8, 4]"])["policy"] == cfg["policy"]
    for override, field in (("policy.max_queue_delay_ms=3", "policy.max_queue_delay_ms"),
                            ("engine.instances=1", "engine.instances"),
                            ('policy.name="delaybatch"', "policy.name"),
                            ("policy.qos_target_ms=5", "policy.qos_target_ms")):
        with pytest.raises(ConfigError) as e:
            resolve(toml, [override])
        assert e.value.field == field and "model.pbtxt" in e.value.message


def test_priority_mix_needs_the_triton_policy_and_enough_levels(tmp_path):
    base = {"model": {"name": "resnet152", "device": "titanrtx", "stages": 1},
            "workload": {"kind": "poisson", "rate_qps": 100, "n_queries": 50, "priority_mix": [0.5, 0.5]}}
    with pytest.raises(ConfigError, match="workload.priority_mix: priorities need"):
        resolve({**base, "policy": {"name": "zerobatch"}})
    with pytest.raises(ConfigError, match="priority_levels = 1"):
        resolve({**base, "policy": {"name": "triton", "priority_levels": 1, "default_priority_level": 1}})
    closed = {**base, "workload": {"kind": "closed", "clients": 4, "n_queries": 50}}
    with pytest.raises(ConfigError, match="workload.kind: a closed loop cannot"):
        resolve({**closed, "policy": {"name": "triton", "max_queue_size": 2}})
    resolve({**closed, "policy": {"name": "triton", "default_timeout_ms": 5.0, "timeout_action": "DELAY"}})


def test_priority_draws_are_seeded_independent_and_in_proportion():
    a = priority_draws([0.2, 0.8], 20_000, seed=4)
    assert np.array_equal(a, priority_draws([0.2, 0.8], 20_000, seed=4)) and set(np.unique(a)) == {1, 2}
    share = float((a == 1).mean())
    assert abs(share - 0.2) < 4 * (0.2 * 0.8 / 20_000) ** 0.5  # binomial: within 4 standard deviations
    w = {"kind": "poisson", "rate_qps": 100.0, "n_queries": 500, "seed": 9}
    plain, mixed = (workload_from_config(x, needs_seq_len=False) for x in (w, {**w, "priority_mix": [0.5, 0.5]}))
    assert plain.priorities is None and np.array_equal(plain.arrivals_ms, mixed.arrivals_ms)
    with pytest.raises(ConfigError, match="sum to 1"):
        priority_draws([0.5, 0.6], 10, seed=0)


def test_a_run_names_its_triton_config_and_counts_refusals(tmp_path):
    r = dvasim.run(EXAMPLES / "resnet152.toml", overrides=["workload.n_queries=3000"])
    s, df = r.summary, r.queries
    streamed = dvasim.run(EXAMPLES / "resnet152.toml", overrides=["workload.n_queries=3000"],
                          records=tmp_path / "q.parquet")
    pd.testing.assert_frame_equal(streamed.queries, df)  # the status column streams to Parquet unchanged
    assert s["triton_config"] == str((EXAMPLES / "resnet152.pbtxt").resolve())
    assert r.config["policy"]["triton_config"] == s["triton_config"] and r.config["engine"]["instances"] == 1
    counts = df["status"].value_counts().to_dict()
    assert s["n_timed_out"] == counts.get("timed_out", 0) > 0 and s["n_rejected"] == counts.get("rejected", 0)
    assert s["n_completed"] == counts["ok"] and r.stuck is None
    assert set(np.unique(df["priority"])) == {1, 2}  # the workload's priority_mix reached the queries


def test_cli_run_exits_0_and_its_summary_counts_rejections(tmp_path):
    out = tmp_path / "bert"
    r = subprocess.run([sys.executable, "-m", "dvasim", "run", str(EXAMPLES / "bert_base.toml"), "--out", str(out),
                        "--no-figure", "--set", "workload.n_queries=1500", "--set", "workload.rate_qps=900"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    printed = r.stdout.split()
    assert printed[printed.index("n_rejected") + 1] == str(s["n_rejected"])
    assert s["n_rejected"] > 0 and s["n_completed"] + s["n_rejected"] + s["n_timed_out"] == 1500
    assert s["triton_config"].endswith("bert_base.pbtxt")
    assert json.loads((out / "config.json").read_text())["config"]["engine"]["instances"] == 2


def test_cli_triton_config_option_replaces_the_policy(tmp_path):
    out = tmp_path / "opt"
    assert main(["run", str(ROOT / "configs" / "default.toml"), "--out", str(out), "--no-figure", "--set",
                 "workload.n_queries=200", "--set", "engine.progress=false", "--triton-config",
                 str(EXAMPLES / "resnet152.pbtxt")]) == 0
    policy = json.loads((out / "config.json").read_text())["config"]["policy"]
    assert policy["name"] == "triton" and policy["priority_levels"] == 2  # delaybatch's keys are gone


@pytest.mark.parametrize("args", [["--triton-config", "no/such/config.pbtxt"],
                                  ["--set", 'policy.triton_config="no/such/config.pbtxt"']])
def test_a_bad_triton_config_path_exits_2_with_one_line(tmp_path, args):
    r = subprocess.run([sys.executable, "-m", "dvasim", "run", str(EXAMPLES / "bert_base.toml"), "--out",
                        str(tmp_path / "x"), *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "policy.triton_config" in lines[0] and "no/such/config.pbtxt" in lines[0]
    assert not (tmp_path / "x").exists()


def test_a_wheel_carries_the_schema_and_the_examples(tmp_path):
    # the data files are the point here: the pure build (tests/test_install.py builds the compiled one)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path), str(ROOT)], check=True, capture_output=True, timeout=300,
                   env={**os.environ, "DVASIM_CORE": "pure"})
    names = set(zipfile.ZipFile(next(tmp_path.glob("dvasim-*.whl"))).namelist())
    for f in ("dvasim/config/triton/model_config.proto", "dvasim/config/triton/model_config.binpb",
              "dvasim/config/triton/PROVENANCE.md", "dvasim/config/triton/LICENSE",
              "dvasim/configs/triton/bert_base.pbtxt", "dvasim/configs/triton/bert_base.toml",
              "dvasim/configs/triton/resnet152.pbtxt", "dvasim/configs/triton/resnet152.toml"):
        assert f in names, f


def test_a_max_batch_size_beyond_the_table_names_the_file(tmp_path):
    p = pbtxt(tmp_path, "max_batch_size: 128\ndynamic_batching { }")
    cfg = {"model": {"name": "resnet152", "device": "titanrtx", "stages": 1}, "policy": {"triton_config": str(p)},
           "workload": {"kind": "poisson", "rate_qps": 100, "n_queries": 20}}
    with pytest.raises(ConfigError) as e:
        dvasim.run(cfg)
    assert e.value.field == "policy.max_batch_size" and str(p) in e.value.message and "64" in e.value.message
    # without dynamic batching every request runs alone: the table needs batch size 1 only
    p.write_text("max_batch_size: 128")
    assert dvasim.run(cfg).summary["mean_exit_batch_size"] == 1.0
