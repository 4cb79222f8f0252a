"""The compiled core (``pip install`` builds it through ``setup.py``; ``make compiled`` rebuilds it in place:
:mod:`dvasim.compiled`, ``tools/compile_core.py``).

Built with mypyc into a temporary copy of the package (the checkout is never touched), every module of
``COMPILED_MODULES`` imports as the compiled extension, a dozen golden runs (every policy of the golden set, every
sharing mode, one and two instances, closed loops, jitter, a host model, exact ties) give every query's record
bit for bit as in ``tests/golden/golden.npz``, and their summaries equal those of a pure copy; so do a short run
of every registered policy (the interpreted policies subclass compiled ones: a class attribute that a compiled
base turned into an instance attribute would not be seen, as TF-Serving OPT_Wait's 30 ms window once was not).

Without mypy (mypyc), setuptools or a C compiler the build tests are skipped, and fail in CI (``CI`` set), where
``make test`` installs the dev extra and with it mypy.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from dvasim.compiled import COMPILED_MODULES, compiled_modules
from dvasim.policies import policy_names
from tests.test_golden import CHANGED_ON_PURPOSE

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
sys.path.insert(0, str(ROOT / "tools"))

from compile_core import copy_package  # noqa: E402

# a dozen cheap golden cases: every policy of the golden set, every sharing mode, 1 and 3 buffer pairs, 2
# instances, input lengths, a closed loop, jitter with admission delays, a host model, exact ties
CASES = (
    "vgg19-zerobatch-fluid", "vgg19-delaybatch-preferred-exclusive", "vgg19-dvabatch-pipelined-parallel",
    "vgg19-dvabatch-multientry-cores", "vgg19-dvabatch-window-fluid", "vgg19-dvabatch-split-exclusive",
    "resnet152-dvabatch-pairs1-inst2", "bert4-dvabatch-rte", "bert2-zerobatch-closed4-think",
    "vgg19-dvabatch-pipelined-jitter", "bert2-delaybatch-host", "dyadic-delaybatch-parallel-inst2-grid",
)

# runs the cases in a fresh interpreter that imports the package from PYTHONPATH (a copy), with the checkout as
# its working directory (the cases' relative table paths); writes their records (.npz) and what it imported. It
# runs as a script file: `python -c` would put the working directory, and the checkout's package, first on the path
CHILD = """
import json, sys
from pathlib import Path
import numpy as np
sys.path.insert(0, sys.argv[1])
from cases import CASES, VGG, _case, _poisson
from make_golden import frame_arrays
import dvasim
from dvasim.compiled import compiled_modules
names, out = json.loads(sys.argv[2]), Path(sys.argv[3])
arrays, summaries = {}, {}
for name in names:
    res = dvasim.run(CASES[name])
    arrays.update({f"{name}/{col}": arr for col, arr in frame_arrays(res.queries).items()})
    summaries[name] = json.dumps({k: v for k, v in res.summary.items() if "wall" not in k}, sort_keys=True,
                                 default=repr)
from dvasim.policies import policy_names
for policy in policy_names():  # every registered policy, its defaults, a load that batches
    res = dvasim.run(_case(VGG, {"name": policy}, _poisson(400.0, n=150)))
    summaries["policy:" + policy] = json.dumps({k: v for k, v in res.summary.items() if "wall" not in k},
                                               sort_keys=True, default=repr)
np.savez(out.with_suffix(".npz"), **arrays)
out.with_suffix(".json").write_text(json.dumps({"package": dvasim.__file__, "compiled": compiled_modules(),
                                                "summaries": summaries}))
"""


def _missing() -> str | None:
    """Why the compiled core cannot be built here, or None."""
    for module, what in (("mypyc", "mypy (mypyc)"), ("setuptools", "setuptools")):
        if importlib.util.find_spec(module) is None:
            return f"{what} is not installed (pip install -e '.[dev]' installs it)"
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        return f"no C compiler ({cc!r} is not on PATH)"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        return "no Python headers (Python.h) to build extension modules against"
    return None


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _run_cases(tree: Path, out: Path) -> tuple[dict, dict[str, np.ndarray]]:
    script = out.with_suffix(".py")
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    r = subprocess.run([sys.executable, str(script), str(GOLDEN), json.dumps(CASES), str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, f"the golden cases failed under {tree}:\n{r.stderr[-4000:]}"
    with np.load(out.with_suffix(".npz")) as z:
        arrays = {k: z[k] for k in z.files}
    return json.loads(out.with_suffix(".json").read_text()), arrays


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The cases run on a compiled copy and on a pure copy of the package: ``{"compiled": ..., "pure": ...}``,
    each ``(what the run reported, its records)``."""
    why = _missing()
    if why is not None:
        if _in_ci():
            pytest.fail(f"the compiled core cannot be built in CI: {why}")
        pytest.skip(f"the compiled core cannot be built here: {why}")
    tmp = tmp_path_factory.mktemp("compiled-core")
    compiled, pure = tmp / "compiled", copy_package(tmp / "pure")
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "compile_core.py"), "--copy-to", str(compiled)],
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, f"tools/compile_core.py failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return {"compiled": _run_cases(compiled, tmp / "compiled-runs"), "pure": _run_cases(pure, tmp / "pure-runs"),
            "trees": {"compiled": compiled, "pure": pure}}


def test_the_list_names_modules_of_the_package_and_the_check_answers_either_way():
    """compiled_modules() answers for every listed module whether or not it is compiled (in this process the
    checkout's modules: compiled where pip install built them and the build is current, else pure)."""
    for name in COMPILED_MODULES:
        assert (ROOT / Path(*name.split("."))).with_suffix(".py").is_file(), name
    got = compiled_modules()
    assert list(got) == list(COMPILED_MODULES) and all(isinstance(v, bool) for v in got.values())


def test_every_listed_module_is_the_compiled_extension(runs):
    info, _ = runs["compiled"]
    assert Path(info["package"]).is_relative_to(runs["trees"]["compiled"]), info["package"]
    assert info["compiled"] == dict.fromkeys(COMPILED_MODULES, True)
    pure, _ = runs["pure"]
    assert Path(pure["package"]).is_relative_to(runs["trees"]["pure"]), pure["package"]
    assert pure["compiled"] == dict.fromkeys(COMPILED_MODULES, False)


@pytest.fixture(scope="module")
def golden():
    with np.load(GOLDEN / "golden.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.mark.parametrize("name", CASES)
def test_compiled_records_equal_the_golden_run(name, runs, golden):
    """Bit for bit: the golden run's records, or for a run changed on purpose (``CHANGED_ON_PURPOSE``, which
    tests/test_golden.py checks against its golden file) those of the pure copy."""
    _, arrays = runs["compiled"]
    got = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith(name + "/")}
    reference = runs["pure"][1] if name in CHANGED_ON_PURPOSE else golden
    want = {k.split("/", 1)[1]: v for k, v in reference.items() if k.startswith(name + "/")}
    assert want and set(got) == set(want)
    for col, arr in want.items():
        np.testing.assert_array_equal(got[col], arr, err_msg=f"{name}: column {col}", strict=True)


@pytest.mark.parametrize("name", CASES)
def test_compiled_summary_equals_the_pure_one(name, runs):
    assert runs["compiled"][0]["summaries"][name] == runs["pure"][0]["summaries"][name]


@pytest.mark.parametrize("policy", policy_names())
def test_every_policy_runs_compiled_as_it_runs_pure(policy, runs):
    compiled, pure = runs["compiled"][0]["summaries"], runs["pure"][0]["summaries"]
    assert json.loads(compiled["policy:" + policy])["n_completed"] == 150
    assert compiled["policy:" + policy] == pure["policy:" + policy]


# ---- which core an import runs (dvasim.compiled.select_core; issue 37: pip install builds the compiled core)

CORE_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import dvasim
from dvasim.compiled import core, compiled_modules
print(json.dumps([core(), compiled_modules(), dvasim.__file__]))
"""


def _core_of(tree: Path, tmp: Path, **env: str) -> tuple[str, dict[str, bool]]:
    script = tmp / "core_child.py"
    script.write_text(CORE_CHILD)
    r = subprocess.run([sys.executable, str(script), str(tree)], cwd=tmp, capture_output=True, text=True,
                       timeout=120, check=False, env={**os.environ, "PYTHONPATH": str(tree), **env})
    assert r.returncode == 0, r.stderr[-3000:]
    line, compiled, package = json.loads(r.stdout)
    assert Path(package).is_relative_to(tree), package
    return line, compiled


def test_a_current_build_runs_compiled_an_edited_or_refused_one_pure(runs, tmp_path):
    """The build's manifest holds its sources' hashes: the compiled tree runs compiled; DVASIM_CORE=pure runs the
    sources of the same tree; a tree whose source changed after its build runs every module pure (never a stale
    extension, never a mix) and says which file is newer; a tree never built says so."""
    tree = runs["trees"]["compiled"]
    line, compiled = _core_of(tree, tmp_path)
    assert line == f"compiled (mypyc, {len(COMPILED_MODULES)} modules)" and all(compiled.values())
    line, compiled = _core_of(tree, tmp_path, DVASIM_CORE="pure")
    assert line == "pure Python (DVASIM_CORE=pure)" and not any(compiled.values())
    edited = tmp_path / "edited"
    shutil.copytree(tree / "dvasim", edited / "dvasim")
    arith = edited / "dvasim" / "core" / "arith.py"
    arith.write_text(arith.read_text() + "\n# edited after the build\n")
    line, compiled = _core_of(edited, tmp_path)
    assert line.startswith("pure Python (the compiled build is older than dvasim/core/arith.py")
    assert not any(compiled.values())
    line, compiled = _core_of(runs["trees"]["pure"], tmp_path)
    assert line == "pure Python (no compiled build found)" and not any(compiled.values())


def test_a_failed_c_build_installs_the_pure_core_with_one_line(tmp_path, capsys):
    """setup.py's build_ext: where the C compiler fails, no extension is left, the manifest records why, and the
    build goes on (the pure modules install) with one line on stderr."""
    setup_py = __import__("runpy").run_path(str(ROOT / "setup.py"), run_name="dvasim_setup")
    from setuptools import Distribution, Extension

    src = tmp_path / "probe.c"
    src.write_text("#error this compiler is made to fail\n")
    dist = Distribution({"name": "probe", "ext_modules": [Extension("dvasim.probe", [str(src)])]})
    cmd = setup_py["OptionalBuildExt"](dist)
    cmd.initialize_options()
    cmd.build_lib, cmd.build_temp = str(tmp_path / "lib"), str(tmp_path / "temp")
    cmd.finalize_options()
    cmd.run()  # does not raise
    manifest = json.loads((tmp_path / "lib" / "dvasim" / "_compiled_core.json").read_text())
    assert manifest["built"] is False and manifest["why"].startswith("the C build failed")
    assert not list((tmp_path / "lib").rglob("*.so"))
    err = capsys.readouterr().err.strip().splitlines()
    assert len([ln for ln in err if ln.startswith("dvasim build:")]) == 1
    assert "installing the pure-Python core" in err[-1]
