"""bench/curve_law.py on the real curves it ships (bench/data): the law predicts held-out decay ends closer than the
trunk's loss at the decay start (every one on the micro grid, on average at the demo's scale, whose decays of 6 to 24
steps leave the decay term barely identified), within a few percent."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parents[2] / "bench" / "curve_law.py"


def test_real_grids_predict_held_out_decays():
    spec = importlib.util.spec_from_file_location("curve_law_bench", BENCH)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look their module up there
    spec.loader.exec_module(bench)
    for grid in bench.GRIDS:
        rows = bench.real_cases(grid)
        assert {r["fit on"] for r in rows} >= {"stable+1 decay", "stable+2 decays"}, grid.name
        law = np.array([abs(r["law rel"]) for r in rows])
        last = np.array([abs(r["last stable rel"]) for r in rows])
        assert law.mean() < 0.8 * last.mean() and law.mean() < 0.02, (grid.name, law.mean(), last.mean())
        if grid.name == "micro":
            assert np.all(law < last), rows
