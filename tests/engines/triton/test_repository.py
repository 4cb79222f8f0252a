"""The model repository the triton engine writes: its config.pbtxt read back by Triton's own schema
(dvasim.config.triton reads it with Triton's model_config.proto) means the policy it came from, and the table the
model runs is the simulator's lookup."""

import pytest

from dvasim.config.triton import triton_settings
from dvasim.engines.triton.repository import emulation, pbtxt_from_file, pbtxt_from_policy
from dvasim.errors import ConfigError
from dvasim.model.table import LatencyTable
from tests.engines.triton.conftest import table_csv


def read_back(tmp_path, text):
    p = tmp_path / "config.pbtxt"
    p.write_text(text)
    return triton_settings(p)


@pytest.mark.parametrize("policy, instances, want", [
    ({"name": "zerobatch", "max_batch_size": 32, "max_queue_delay_ms": 0.0}, 1,
     {"max_batch_size": 32, "max_queue_delay_ms": 0.0, "preferred_batch_size": []}),
    ({"name": "delaybatch", "max_batch_size": 16, "max_queue_delay_ms": 2.5, "preferred_batch_size": [4, 8]}, 3,
     {"max_batch_size": 16, "max_queue_delay_ms": 2.5, "preferred_batch_size": [4, 8]}),
    ({"name": "triton", "max_batch_size": 8, "max_queue_delay_ms": 1.0, "max_queue_size": 8,
      "default_timeout_ms": 20.0, "timeout_action": "REJECT", "priority_levels": 2, "default_priority_level": 2}, 2,
     {"max_queue_size": 8, "default_timeout_ms": 20.0, "priority_levels": 2, "default_priority_level": 2}),
])
def test_pbtxt_from_policy_reads_back_as_the_policy(tmp_path, policy, instances, want):
    params, n = read_back(tmp_path, pbtxt_from_policy(policy, instances))
    assert n == instances
    for k, v in want.items():
        assert params[k] == v, k


def test_a_policy_triton_does_not_run_is_refused():
    with pytest.raises(ConfigError, match="policy.name"):
        pbtxt_from_policy({"name": "dvabatch"}, 1)


def test_users_pbtxt_keeps_its_batching_and_serves_on_the_cpu(tmp_path):
    src = tmp_path / "user.pbtxt"
    src.write_text('name: "bert" platform: "tensorrt_plan" max_batch_size: 16\n'
                   'input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
                   'dynamic_batching { preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 1000 '
                   'default_queue_policy { max_queue_size: 32 } }\n'
                   'instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0 ] } ]\n')
    text = pbtxt_from_file(src)
    assert 'backend: "python"' in text and "tensorrt_plan" not in text and "KIND_CPU" in text
    params, n = read_back(tmp_path, text)
    orig, n0 = triton_settings(src)
    assert n == n0 == 2
    for k in ("max_batch_size", "preferred_batch_size", "max_queue_delay_ms", "max_queue_size"):
        assert params[k] == orig[k]


def test_emulation_is_the_tables_lookup(tmp_path):
    tab = LatencyTable.load(table_csv(tmp_path / "t.csv", lambda b: 3 + 0.6 * b))
    emu = emulation(tab, 8, None)
    assert emu["lengths"] == [1]
    assert emu["latency_ms"]["1"] == [pytest.approx(3 + 0.6 * b) for b in range(1, 9)]
    assert emu["demand"]["1"] == [pytest.approx(tab.demand(0, b)) for b in range(1, 9)]


def test_emulation_refuses_a_sliced_model(tmp_path):
    p = tmp_path / "two.csv"
    p.write_text("stage,batch_size,latency_ms\n0,1,1\n0,2,2\n1,1,1\n1,2,2\n")
    with pytest.raises(ConfigError, match="model.stages"):
        emulation(LatencyTable.load(p), 2, None)
