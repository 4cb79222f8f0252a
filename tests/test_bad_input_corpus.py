"""A corpus of bad inputs found by fuzzing (issue 11): each must give one line naming the field and the fix,
exit status 2, no traceback, and nothing written -- checked before any simulation starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from dvasim.cli import main
from tests.cli.test_cli import assert_one_line_error

ROOT = Path(__file__).resolve().parent.parent
CONFIG = str(ROOT / "configs/default.toml")
NAMED = '[model]\nname = "vgg19"\ndevice = "titanrtx"\n[policy]\nname = "zerobatch"\nmax_batch_size = 8\n' \
        '[workload]\nkind = "poisson"\nrate_qps = 50\nn_queries = 100\n'


@pytest.fixture
def named(tmp_path):
    p = tmp_path / "named.toml"
    p.write_text(NAMED)
    return str(p)


def run_cli(argv, capsys):
    code = main(argv)
    return code, capsys.readouterr().err


def assert_worked_or_refused(code, err, out, context) -> None:
    """A run either works (0) or fails one line with status 2, no traceback, writing nothing."""
    assert code in (0, 2), (context, code, err)
    if code == 2:
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, (context, err)
        assert not out.exists(), context


@pytest.mark.parametrize("override,field", [
    ("model.cuts=5", "model.cuts"),
    ("model.ratios=[true]", "model.ratios"),
    ("model.slice_batch_size=nan", "model.slice_batch_size"),
    ("model.slice_batch_size=2.5", "model.slice_batch_size"),
    ('model.slice_batch_size="1"', "model.slice_batch_size"),
    ("model.slice_batch_size=true", "model.slice_batch_size"),
    ("workload.n_queries=1000000000000000", "workload.n_queries"),
    ("engine.buffer_pairs=4611686018427387904", "engine.buffer_pairs"),
    ("engine.instances=4611686018427387904", "engine.instances"),
])
def test_bad_values_are_refused_before_any_work(override, field, named, tmp_path, capsys):
    out = tmp_path / "out"
    code, err = run_cli(["run", named, "--out", str(out), "--set", override], capsys)
    assert_one_line_error(code, err, field)
    assert not out.exists()


def test_sizes_beyond_the_machine_state_the_limit(named, tmp_path, capsys):
    code, err = run_cli(["run", named, "--out", str(tmp_path / "o"), "--set", "workload.n_queries=10**15"], capsys)
    assert_one_line_error(code, err)  # not a TOML value
    code, err = run_cli(["run", named, "--out", str(tmp_path / "o"), "--set", "engine.instances=65"], capsys)
    assert_one_line_error(code, err, "engine.instances", "1..64")


def test_unreadable_configs(tmp_path, capsys):
    bad = tmp_path / "latin1.toml"
    bad.write_bytes(b'[model]\ntable = "caf\xe9.csv"\n')
    code, err = run_cli(["run", str(bad), "--out", str(tmp_path / "o")], capsys)
    assert_one_line_error(code, err, "config", "UTF-8")
    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + "[" * 3000 + "]" * 3000 + "\n")
    code, err = run_cli(["run", str(deep), "--out", str(tmp_path / "o")], capsys)
    assert_one_line_error(code, err, "config", "nested")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["run", "compare"])
@pytest.mark.parametrize("where", ["file", "below-file", "/dev/null"])
def test_out_that_cannot_be_a_directory(command, where, tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("keep me")
    out = {"file": str(f), "below-file": str(f / "sub"), "/dev/null": "/dev/null"}[where]
    argv = ["run", CONFIG, "--out", out] if command == "run" else ["compare", "--quick", "--out", out]
    code, err = run_cli(argv, capsys)
    assert_one_line_error(code, err, "--out")
    assert f.read_text() == "keep me"


@pytest.mark.parametrize("argv,field", [
    (["compare", "--models", ""], "--models"),
    (["compare", "--seed", "-1"], "--seed"),
    (["compare", "--bogus"], "--bogus"),
    (["compare", "--queries", "many"], "--queries"),
    ([], "command"),
    (["run"], "required"),
    (["frobnicate"], "invalid choice"),
    (["run", CONFIG, "--out", "x", "--nope"], "--nope"),
])
def test_usage_errors_are_one_line(argv, field, capsys):
    code, err = run_cli(argv, capsys)
    assert_one_line_error(code, err, field)


def test_version(capsys):
    from importlib import metadata

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"dvasim {metadata.version('dvasim')}"


KEYS = ["model.stages", "model.cuts", "model.ratios", "model.slice_batch_size", "model.device", "model.name",
        "policy.max_batch_size", "policy.max_queue_delay_ms", "policy.t_comp_wait_ms", "policy.t_comp_wait_frac",
        "policy.split_factor", "policy.split_manner", "policy.policies", "policy.max_clusters",
        "policy.preferred_batch_size", "workload.rate_qps", "workload.n_queries", "workload.seed",
        "workload.start_ms", "workload.kind", "workload.seq_len", "workload.seq_len_dist", "engine.buffer_pairs",
        "engine.instances", "engine.sharing", "engine.cores", "engine.corun_slowdown", "engine.launch_overhead_ms",
        "engine.admission_delay_ms", "engine.service_cv", "qos.target_ms"]
VALUES = ["0", "-1", "1e400", "nan", "inf", "-inf", "2.5", "true", '"x"', '"1"', "[]", "[true]", "[1,2]",
          "[0.5,0.5]", "{a=1}", "5", "65", "1e9", "2**3", "[[1]]", '"glue:RTE"', '"poisson"']


def test_random_bad_overrides_never_escape(named, tmp_path, capsys):
    """Random (mostly bad) --set values on every key: the run either works (0), or fails one line with status
    2 and writes nothing. ``make fuzz`` runs 2,000 of them, ``make test`` 60."""
    import os
    import random

    rng = random.Random(7)
    n = int(os.environ.get("DVASIM_FUZZ_EXAMPLES", "60"))
    for i in range(n):
        sets = [f"{rng.choice(KEYS)}={rng.choice(VALUES)}" for _ in range(rng.randint(1, 2))]
        out = tmp_path / f"o{i}"
        code = main(["run", rng.choice([CONFIG, named]), "--out", str(out), "--no-figure",
                     "--set", "workload.n_queries=50", *sum([["--set", s] for s in sets], [])])
        assert_worked_or_refused(code, capsys.readouterr().err, out, sets)


# the peer systems' own parameters (issue 14) and the engine's input copies: each key set on its own policy
PEER_KEYS = {
    "serial": ["policy.max_batch_size"],
    "graphbatch": ["policy.window_ms", "policy.max_batch_size"],
    "tfserving-optwait": ["policy.max_queue_delay_ms", "policy.max_batch_size"],
    "tfserving-static": ["policy.max_queue_delay_ms", "policy.max_batch_size"],
    "lazybatch": ["policy.sla_ms", "policy.predictor", "policy.dec_timesteps", "policy.dec_coverage",
                  "policy.max_batch_size"],
    "n-ebird": ["policy.workers", "policy.max_inf"],
    "e-ebird": ["policy.total_bs", "policy.max_inf"],
}
ENGINE_KEYS = ["engine.transfer.mode", "engine.transfer.input_bytes", "engine.transfer.bandwidth_gbps",
               "engine.transfer.input_bytes_per_token", "workload.phases"]
PEER_VALUES = [*VALUES, '"pool"', '"on_launch"', '"oracle"', "[1,1,2]", "[4,8]", "[{n=10,rate_qps=50}]", "0.9"]


def test_random_bad_overrides_of_the_peer_systems_never_escape(named, tmp_path, capsys):
    """As above, on the peer systems' parameters (each set on its own policy), the input-copy model and the phases
    load: the run works (0) or fails one line with status 2, writing nothing."""
    import os
    import random

    rng = random.Random(11)
    n = int(os.environ.get("DVASIM_FUZZ_EXAMPLES", "60"))
    codes = set()
    for i in range(n):
        name = rng.choice(sorted(PEER_KEYS))
        sets = [f"{rng.choice(PEER_KEYS[name] + ENGINE_KEYS)}={rng.choice(PEER_VALUES)}"
                for _ in range(rng.randint(1, 2))]
        if any(s.startswith("workload.phases") for s in sets):
            sets.insert(0, 'workload={kind="phases",phases=[{n=20,rate_qps=40}]}')
        out = tmp_path / f"p{i}"
        code = main(["run", named, "--out", str(out), "--no-figure", "--set", f'policy={{name="{name}"}}',
                     "--set", "workload.n_queries=40", *sum([["--set", s] for s in sets], [])])
        codes.add(code)
        assert_worked_or_refused(code, capsys.readouterr().err, out, (name, sets))
    assert codes == {0, 2}  # both outcomes were exercised


# the serving stack ([server], issue 20) and the host model's launch law: on the named model and on the default
# table (which names no operators, so a per-operator launch cost there must be refused, not guessed)
STACK_KEYS = ["server.stack", "server.request_ms", "server.request_per_row_ms", "server.gather_gbps",
              "server.h2d_gbps", "server.pinned", "server.sync_ms", "server.idle_between_batches", "server.modules",
              "server.launch_per_op_ms", "server.launch_fixed_ms", "server.python_ms", "server.host_cores",
              "server.interpreter_lock", "server.corun_per_worker", "engine.host.launch_per_op_ms",
              "engine.host.first_launch_ms", "engine.host.first_copy_ms", "engine.host.launch_fixed_ms"]
STACK_VALUES = [*VALUES, '"tfserving"', '"gpu-only"', '"triton-tensorrt"', '"pytorch-eager"', '"eager"', "false",
                "0.3", "-0.5"]


def test_random_bad_overrides_of_the_serving_stack_never_escape(named, tmp_path, capsys):
    """Random --set values on [server] and the launch law: the run works (0) or fails one line with status 2,
    writing nothing; both outcomes occur."""
    import os
    import random

    rng = random.Random(13)
    n = int(os.environ.get("DVASIM_FUZZ_EXAMPLES", "60"))
    codes = set()
    for i in range(n):
        sets = [f"{rng.choice(STACK_KEYS)}={rng.choice(STACK_VALUES)}" for _ in range(rng.randint(1, 2))]
        out = tmp_path / f"s{i}"
        code = main(["run", rng.choice([CONFIG, named]), "--out", str(out), "--no-figure",
                     "--set", "workload.n_queries=40", *sum([["--set", s] for s in sets], [])])
        codes.add(code)
        assert_worked_or_refused(code, capsys.readouterr().err, out, sets)
    assert codes == {0, 2}
