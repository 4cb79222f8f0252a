"""Identical results (issue 12): every query's timestamps of a fixed set of runs equal, bit for bit, those of the
engine the golden files were made with (``tests/golden/golden.json`` names its commit).

The cases (``tests/golden/cases.py``) cover every policy, every sharing mode, buffer pairs 1-3, instances 1-2,
open, stepping, bursty and closed loads, jitter, admission delays and a host model. A case may differ from its
golden file only where a named bug fix changed it on purpose: list it in ``CHANGED_ON_PURPOSE`` with the fix.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import dvasim

GOLDEN = Path(__file__).resolve().parent / "golden"
sys.path.insert(0, str(GOLDEN))

from cases import CASES  # noqa: E402
from make_golden import frame_arrays  # noqa: E402

# case name -> the fix that changed its results on purpose (none so far)
CHANGED_ON_PURPOSE: dict[str, str] = {}


@pytest.fixture(scope="module")
def golden():
    with np.load(GOLDEN / "golden.npz") as z:
        return {k: z[k] for k in z.files}


def test_golden_files_cover_every_case_and_name_their_engine():
    meta = json.loads((GOLDEN / "golden.json").read_text())
    assert len(meta["engine_commit"]) == 40 and not meta["engine_dirty"]
    assert set(meta["cases"]) == set(CASES)


@pytest.mark.parametrize("name", sorted(set(CASES) - set(CHANGED_ON_PURPOSE)))
def test_every_query_timestamp_equals_the_golden_run(name, golden):
    res = dvasim.run(CASES[name])
    got = frame_arrays(res.queries)
    want = {k.split("/", 1)[1]: v for k, v in golden.items() if k.startswith(name + "/")}
    assert set(got) == set(want)
    for col, arr in want.items():
        # exact: same floats, NaN where the golden run had NaN
        np.testing.assert_array_equal(got[col], arr, err_msg=f"{name}: column {col}", strict=True)
