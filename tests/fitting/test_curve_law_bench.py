"""bench/curve_law.py on the real curves it ships (bench/data): the law predicts every held-out decay end closer than
the trunk's loss at the decay start, and within a few percent."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "curve_law.py"


@pytest.mark.slow  # a dozen multi-start fits of the curve law: ~20 s on a 2-core machine
def test_real_grids_predict_held_out_decays():
    spec = importlib.util.spec_from_file_location("curve_law_bench", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for grid in bench.GRIDS:
        rows = bench.real_cases(grid)
        assert {r["fit on"] for r in rows} >= {"stable+1 decay", "stable+2 decays"}, grid.name
        law = np.array([abs(r["law rel"]) for r in rows])
        last = np.array([abs(r["last stable rel"]) for r in rows])
        assert np.all(law < last), (grid.name, rows)
        assert law.mean() < 0.02, grid.name
