"""``dvasim policies``: every registered policy, its aliases and parameters, as a user configures them."""

import inspect
import json
import subprocess
import sys

import pytest

from dvasim.errors import ConfigError
from dvasim.policies import base
from dvasim.policies.base import make_policy, policy_names, policy_reference


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "dvasim", "policies", *args], capture_output=True, text=True)


def test_json_reference_lists_every_policy_with_its_declared_parameters_and_real_defaults():
    p = _cli("--json")
    assert p.returncode == 0, p.stderr
    refs = {r["name"]: r for r in json.loads(p.stdout)}
    assert sorted(refs) == policy_names()
    for name, ref in refs.items():
        cls = base._REGISTRY[name]
        assert list(ref["params"]) == list(cls.params)
        assert ref["summary"], name  # every policy says what it is
        sig = inspect.signature(cls)
        for key, p in ref["params"].items():
            default = sig.parameters[key].default
            if default is not inspect.Parameter.empty and default is not None:
                assert p["default"] == (default if isinstance(default, (int, float, str, bool)) else str(default))
    # an instance built from the defaults carries them (the reference does not invent defaults)
    assert make_policy("serial").max_batch_size == refs["serial"]["params"]["max_batch_size"]["default"] == 1
    checked = 0
    for name, ref in refs.items():
        pol = make_policy(name)
        for key, p in ref["params"].items():
            if p["default"] is not None and hasattr(pol, key):
                assert getattr(pol, key) == p["default"], (name, key)
                checked += 1
    assert checked >= 15  # most declared defaults are visible on the instance


def test_text_reference_of_one_policy_and_the_error_for_an_unknown_one():
    p = _cli("graphbatch")
    assert p.returncode == 0 and p.stdout.startswith("graphbatch\n")
    assert "window_ms [5.0]" in p.stdout and "max_batch_size" in p.stdout
    bad = _cli("nonesuch")
    assert bad.returncode == 2 and bad.stdout == ""
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and "'nonesuch'" in lines[0] and "zerobatch" in lines[0]


def test_an_alias_names_the_same_policy_everywhere():
    @base.register
    class _Probe(base._REGISTRY["serial"]):
        """A probe policy (test only)."""

        name = "probe-serial"
        aliases = ("probe-alias",)

    try:
        assert type(make_policy("probe-alias")) is _Probe
        assert policy_reference("probe-alias")["name"] == "probe-serial"
        assert policy_reference("probe-serial")["aliases"] == ["probe-alias"]
        with pytest.raises(ConfigError, match="unknown policy 'probe-other'"):
            make_policy("probe-other")
    finally:
        del base._REGISTRY["probe-serial"], base._ALIASES["probe-alias"]
