"""The what-if notebooks run top to bottom (their own assertions included)."""

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path):
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not any(o.get("output_type") == "error" for o in outputs)
    assert any("text/html" in o.get("data", {}) for o in outputs), "the notebook shows its result table"


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
            "capacity_under_50ms", "which_batching_system"} <= names
