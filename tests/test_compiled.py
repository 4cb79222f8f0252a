"""The optional compiled core (``make compiled``: :mod:`dvasim.compiled`, ``tools/compile_core.py``).

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
    checkout's modules: pure, or compiled after `make compiled`)."""
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
