"""bench/family_oracle.py: the oracle's refit recovers each family's truth from its runs, and its spread of D*
estimates sits around the true D* when the runs are nearly noise-free (so a wide spread on the benchmark's truths is
the noise's doing, not the refit's)."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import cross_family as bench  # noqa: E402  (bench/ is scripts, not a package)
import family_oracle as oracle  # noqa: E402


@pytest.mark.parametrize("family", bench.FAMILIES)
def test_the_refit_recovers_the_truth_from_a_start_off_it(family: str) -> None:
    case = replace(bench.draw_case(0, family, 0.3, seed=3), noise=0.0, trunk_noise=0.0)
    t = bench.tables(case)
    start = {k: v * (1.05 if i % 2 else 0.95) for i, (k, v) in enumerate(case.params.items())}
    assert start != case.params
    fitted = oracle.refit(family, start, t["scratch"], t["upcycled"])
    assert bench.true_dstar(fitted, family) == pytest.approx(case.dstar, rel=1e-3)


def test_the_spread_sits_around_the_truth_when_the_runs_are_nearly_exact() -> None:
    case = replace(bench.draw_case(1, "effective", 1.0, seed=3), noise=0.001, trunk_noise=0.0)
    out = oracle.oracle((case, 3))
    lo, hi = out["oracle_80"]
    assert hi is not None and out["no_crossing"] == 0
    assert abs(math.log10(lo / case.dstar)) < 0.1 and abs(math.log10(hi / case.dstar)) < 0.1
