"""A portable install (issue 13): the wheel carries traces/ and configs/, so an installed dvasim runs named models,
shipped traces and the README's examples from any directory, without the checkout; and (issue 37) the wheel that
``pip`` builds holds the compiled core where a C compiler exists, and the installed package runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("install")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp / "dist"), str(ROOT)], check=True, capture_output=True)
    wheel = next((tmp / "dist").glob("dvasim-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp / "site"),
                    str(wheel)], check=True, capture_output=True)
    work = tmp / "elsewhere"  # not the checkout: nothing of it is on the path or under the working directory
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(tmp / "site")}
    env.pop("DVASIM_TRACES_DIR", None)
    return tmp / "site", work, env


def _py(code: str, installed) -> subprocess.CompletedProcess:
    _, work, env = installed
    return subprocess.run([sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_installed_package_runs_from_its_own_data(installed):
    site, _, _ = installed
    out = _py("import dvasim, dvasim.paths as p; print(dvasim.__file__); print(p.traces_dir())", installed)
    assert out.returncode == 0, out.stderr
    pkg, traces = out.stdout.split()
    assert Path(pkg).is_relative_to(site) and Path(traces) == site / "dvasim" / "traces"
    assert (site / "dvasim" / "traces" / "glue" / "RTE.csv").is_file()
    assert (site / "dvasim" / "configs" / "default.toml").is_file()


def test_the_readme_python_example_runs_in_any_directory(installed):
    text = (ROOT / "README.md").read_text()
    block = re.search(r"From Python:\s*```python\n(.*?)```", text, re.S).group(1)
    code = block + "\nimport dvasim as _d\nprint('from', _d.__file__)\nprint('rows', len(r.queries), len(long.queries))\n"
    out = _py(code, installed)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"from {installed[0]}" in out.stdout and "rows 5000 20000" in out.stdout
    assert (installed[1] / "q.parquet").stat().st_size > 0
    assert "simulating" not in out.stderr  # no progress bar when the output is not a terminal


def test_the_cli_runs_a_named_model_and_the_shipped_config_in_any_directory(installed):
    _, work, env = installed
    for args in (["run", "configs/default.toml", "--out", "a", "--set", "workload.n_queries=300", "--no-figure"],
                 ["run", "configs/default.toml", "--out", "b", "--no-figure", "--set",
                  'model={name = "resnet152", device = "a100", stages = 3}', "--set", "workload.n_queries=300"],
                 ["--version"]):
        out = subprocess.run([sys.executable, "-m", "dvasim", *args], cwd=work, env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr
    assert (work / "a" / "summary.json").is_file() and (work / "b" / "queries.parquet").is_file()


def test_pip_builds_the_compiled_core_and_the_install_runs_it(installed):
    """setup.py compiled every module of COMPILED_MODULES into the wheel, with the manifest of its sources, and
    ``dvasim --version`` of the installed package says the compiled core runs."""
    from tests.test_compiled import _in_ci, _missing

    why = _missing()
    if why is not None:
        if _in_ci():
            pytest.fail(f"the compiled core cannot be built in CI: {why}")
        pytest.skip(f"the compiled core cannot be built here: {why}")
    from dvasim.compiled import COMPILED_MODULES

    site, work, env = installed
    for name in COMPILED_MODULES:
        folder, stem = site / Path(*name.split(".")[:-1]), name.split(".")[-1]
        assert list(folder.glob(f"{stem}.*.so")) or list(folder.glob(f"{stem}.*.pyd")), name
    out = subprocess.run([sys.executable, "-m", "dvasim", "--version"], cwd=work, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith(f"core: compiled (mypyc, {len(COMPILED_MODULES)} modules)")
