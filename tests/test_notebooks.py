"""The what-if notebooks run top to bottom (their own assertions included), show their plots inline (issue 23: no
backend forced on a notebook) and colour every policy as every other figure does."""

import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
# notebooks that run for minutes (capacity searches of 60 s probes with their trigger runs) execute under
# `make test-slow`, without a time limit per cell
SLOW = {"how_many_gpus", "policy_for_bert_on_h100", "which_batching_system", "capacity_under_50ms"}


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow) if p.stem in SLOW else p
                                  for p in NOTEBOOKS], ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path):
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=None if path.stem in SLOW else 300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not any(o.get("output_type") == "error" for o in outputs)
    assert any("text/html" in o.get("data", {}) for o in outputs), "the notebook shows its result table"
    # every cell that plots shows its figure (a forced Agg backend left them blank)
    for cell in nb.cells:
        if cell.cell_type == "code" and PLOTS.search(cell.source):
            assert any("image/png" in o.get("data", {}) for o in cell.get("outputs", [])), (path.name, cell.source)


PLOTS = re.compile(r"\bsns\.\w*plot\(|\bdisplay\(Image\(")


def test_a_plot_after_a_sweep_shows_inline():
    """which_batch_window runs dvasim's sweep (which draws and writes its own figure) before its plot cell."""
    nb = nbformat.read(NOTEBOOKS[0].parent / "which_batch_window.ipynb", as_version=4)
    sweep = next(i for i, c in enumerate(nb.cells) if "sweep(" in c.source)
    assert any(PLOTS.search(c.source) for c in nb.cells[sweep + 1:] if c.cell_type == "code")


def test_notebooks_colour_policies_with_the_one_palette():
    """A plot whose hue is a policy (or a batching system, named like one) takes its colours from
    ``dvasim.reporting.plots.policy_colours``, as the command line's and the experiments' figures do."""
    hued = 0
    for path in NOTEBOOKS:
        for cell in nbformat.read(path, as_version=4).cells:
            for call in re.findall(r"sns\.\w+\((?:[^()]|\([^()]*\))*\)", cell.source):
                if re.search(r'hue="(policy|system)"', call):
                    hued += 1
                    assert re.search(r"palette=policy_colours\(", call), (path.name, call)
                    assert "bar" not in call or "saturation=1" in call, (path.name, call)
    assert hued >= 4


def test_there_is_a_notebook():
    assert NOTEBOOKS


def test_notebooks_are_committed_without_outputs():
    """Outputs are stripped in git: a notebook's results come from running it, never from a stale copy."""
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.get("outputs") == [] and cell.get("execution_count") is None, path.name


def test_the_studies_a_user_starts_from_have_notebooks():
    names = {p.stem for p in NOTEBOOKS}
    assert {"policy_for_bert_on_h100", "how_many_stages", "which_batch_window", "real_trace_each_policy",
            "capacity_under_50ms", "which_batching_system", "how_many_gpus"} <= names
