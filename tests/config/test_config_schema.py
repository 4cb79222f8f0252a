"""One config schema (issue 22): every section's keys, types, ranges, defaults and help are declared once, and the
checks, ``--set``, the help and ``docs/config.md`` all come from that declaration."""

from __future__ import annotations

from pathlib import Path

import pytest

from dvasim import config as cfgmod
from dvasim.config.reference import reference_markdown, section_help
from dvasim.config.sections import SCHEMA, SUBSECTIONS
from dvasim.errors import ConfigError
from dvasim.schema import Key

ROOT = Path(__file__).resolve().parents[2]
BASE = {"model": {"name": "resnet152", "device": "titanrtx", "stages": 2},
        "workload": {"kind": "poisson", "rate_qps": 50, "n_queries": 10}}
ALL = {**SCHEMA, **SUBSECTIONS}
CHECKED_BY_RESOLVE = ("model", "qos", "engine", "replay", "server", "engine.host", "engine.transfer")


def _keys(names=CHECKED_BY_RESOLVE):
    return [(s, k) for s in names for k in ALL[s].keys]


def test_the_reference_in_docs_is_the_schema_rendered():
    """docs/config.md is generated; regenerate it with dvasim config --reference > docs/config.md."""
    from dvasim.cli.config import reference_text

    text = (ROOT / "docs" / "config.md").read_text(encoding="utf-8")
    assert text == reference_text()
    assert reference_markdown() in text
    for name in ALL:  # every section, sub-tables included, has its heading
        assert f"[{name}]" in text


def test_dvasim_config_prints_a_sections_help_and_the_reference(capsys):
    from dvasim.cli import main

    assert main(["config", "engine.transfer"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {k.name}" in out for k in SUBSECTIONS["engine.transfer"].keys)
    assert main(["config", "sweep.capacity"]) == 0
    assert "slo_ms" in capsys.readouterr().out
    assert main(["config", "--reference"]) == 0
    assert capsys.readouterr().out == (ROOT / "docs" / "config.md").read_text(encoding="utf-8")
    assert main(["config", "engin"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "engine.host" in err


def test_every_key_has_help_and_its_default_passes_its_own_check():
    for section, key in _keys(ALL):
        assert len(key.help) > 8, f"{section}.{key.name} has no help"
        if key.has_default and key.default is not None and key.kind not in ("table", "any"):
            key.check(section, key.default)  # raises if the declared default is outside the declared range


def _bad_values(key: Key) -> list:
    """Values the declaration itself says are wrong."""
    bad: list = []
    if key.kind in ("int", "number", "per_stage"):
        bad.append("fast")
        if key.minimum is not None:
            bad.append(key.minimum - 1)
        if key.maximum is not None:
            bad.append(key.maximum + 1)
    elif key.kind == "bool":
        bad += ["yes", 1]
    elif key.kind == "choice":
        bad.append("no-such-" + key.name)
    elif key.kind in ("numbers", "ints", "quantiles"):
        bad += ["1,2", ["x"]]
    elif key.kind in ("table", "path", "str"):
        bad.append(3)
    return bad


@pytest.mark.parametrize("section,key", _keys(), ids=lambda v: v if isinstance(v, str) else v.name)
def test_resolve_refuses_what_the_schema_declares_wrong_naming_the_field(section, key):
    """Every declared type and range is enforced by resolve, with a one-line error naming section.key."""
    for bad in _bad_values(key):
        top, _, sub = section.partition(".")
        raw = {**BASE, top: dict(BASE.get(top, {}))}
        target = raw[top] if not sub else raw[top].setdefault(sub, {})
        target[key.name] = bad
        if section == "model" and key.name == "table":
            raw["model"] = {"table": bad}
        with pytest.raises(ConfigError) as e:
            cfgmod.resolve(raw)
        assert e.value.field == f"{section}.{key.name}", (bad, e.value)
        assert "\n" not in e.value.message


def test_defaults_come_from_the_schema():
    cfg = cfgmod.resolve(BASE)
    for name in ("qos", "engine", "replay", "policy"):
        for k in SCHEMA[name].keys:
            if k.has_default and k.default is not None and k.kind != "table":
                assert cfg[name][k.name] == k.default, f"{name}.{k.name}"


def test_set_reaches_every_declared_sub_table_key():
    """--set engine.host.KEY and engine.transfer.KEY land in the sub-table the schema declares."""
    for sub, section in SUBSECTIONS.items():
        top, _, name = sub.partition(".")
        for k in section.keys:
            if k.has_default and k.default is not None and not isinstance(k.default, list):
                value = k.default if not isinstance(k.default, str) else f'"{k.default}"'
                if isinstance(value, bool):
                    value = str(value).lower()
                cfg = cfgmod.resolve(BASE, overrides=[f"{sub}.{k.name}={value}"])
                assert k.name in cfg[top][name], sub


def test_set_of_an_undeclared_key_names_it():
    with pytest.raises(ConfigError) as e:
        cfgmod.resolve(BASE, overrides=["engine.buffer_pair=3"])
    assert e.value.field == "engine.buffer_pair" and "buffer_pairs" in e.value.message


def test_help_lists_every_key_of_a_section():
    text = section_help(SUBSECTIONS["engine.host"])
    for k in SUBSECTIONS["engine.host"].keys:
        assert f"  {k.name}" in text
