"""bench/twin_truths.py: the distance it measures is the runs' own (Mahalanobis in the generator's covariance), the
coverage cap follows from it, and a twin it returns is a valid truth more than a decade from the case's D*."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import norm

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import cross_family as bench  # noqa: E402  (bench/ is scripts, not a package)
import twin_truths as twin  # noqa: E402

from upscale.fitting.laws import LOSS, TRUNK  # noqa: E402


def test_the_whitener_turns_squared_residuals_into_the_mahalanobis_distance() -> None:
    grid = bench.tables(bench.draw_case(0, "curved", 0.3, seed=3))["upcycled"].drop(columns=LOSS)
    noise, trunk_noise = 0.005, 0.01
    trunk = grid[TRUNK].to_numpy()
    cov = noise**2 * np.eye(len(grid)) + trunk_noise**2 * (trunk[:, None] == trunk[None, :])
    d = np.random.default_rng(0).normal(0, 0.01, len(grid))
    w = twin.whitener(grid, noise, trunk_noise)
    assert np.sum((w @ d) ** 2) == pytest.approx(d @ np.linalg.solve(cov, d), rel=1e-9)


def test_the_coverage_cap_is_le_cams_two_point_bound() -> None:
    # One dimension, means m apart with unit SD: the total variation is 2Φ(m/2) − 1, Δ = m².
    for m in (0.0, 0.5, 1.68, 3.0):
        xs = np.linspace(-12, 12 + m, 200_001)
        tv = 0.5 * np.trapezoid(np.abs(norm.pdf(xs) - norm.pdf(xs - m)), xs)
        assert twin.tv_distance(m * m) == pytest.approx(tv, abs=1e-6)
    assert twin.max_coverage(0.0) == 0.5
    # Both coverages can reach 80% only once the twin is 2·Φ⁻¹(0.8) SDs away (Δ ≈ 2.83).
    edge = (2 * norm.ppf(0.8)) ** 2
    assert twin.max_coverage(edge) == pytest.approx(0.8)
    assert twin.max_coverage(edge * 0.9) < 0.8 < twin.max_coverage(edge * 1.1)


def test_a_twin_is_a_valid_truth_more_than_a_decade_away() -> None:
    case = bench.draw_case(5, "curved", 1.0, seed=0)
    runs = twin.Runs.of(case)
    found = twin.fit_twin(case, case.family, dict(case.params), twin.RATIOS[0], runs)
    assert found is not None
    assert bench.true_dstar(found["params"], case.family) == pytest.approx(case.dstar * twin.RATIOS[0], rel=1e-3)
    assert all(abs(math.log10(r)) > 1 for r in twin.RATIOS) and bench._falls(found["params"], case.family)
    mu2 = twin.mean_log_losses(found["params"], case.family, runs.cols)
    direct = sum(np.sum((runs.white[k] @ (mu2[k] - runs.mu1[k])) ** 2) for k in twin.KINDS)
    assert found["delta"] == pytest.approx(direct) and found["delta"] > 0
    assert math.isclose(found["max_coverage"], twin.max_coverage(found["delta"]))


def test_a_bent_twin_keeps_its_losses_falling_and_upcycling_ahead_past_a_decade() -> None:
    case = bench.draw_case(7, "transfer-ratio", 1.0, seed=0)
    found = twin.late_twin(case)
    assert found is not None and found["max_coverage"] == pytest.approx(twin.max_coverage(found["delta"]))
    eps, half, q, k, arm = found["eps"], found["half"], found["q"], found["k"], found["arm"]
    assert twin._bent_valid(case, arm, eps, half, q, k) and k in twin.LATE_K
    dstar = twin._bent_dstar(case, eps, half, q)
    assert dstar > 10 * case.dstar and (found["dstar"] is None) == math.isinf(dstar)
    # Upcycling stays ahead from T1's D* to the ratio times it: the bend lifts the gap over that stretch.
    stretch = np.geomspace(case.dstar, case.dstar * found["ratio"], 50)
    assert np.all(bench.log_gap(case.params, case.family, stretch) + eps * twin.hill(stretch, half, q) > 0)
    assert bench.log_gap(case.params, case.family, stretch[1:2])[0] < 0  # T1's own gap has turned just past its D*
    # Δ: only the bent arm's runs move, by ε·H·(N/N_ref)^k at their budgets and sizes, in the runs' own noise.
    runs = twin.Runs.of(case)
    d, n = (runs.cols[arm]["D"], runs.cols[arm]["N"]) if arm == "scratch" else (runs.cols[arm]["D2"],
                                                                                  runs.cols[arm]["N1"])
    move = eps * twin.hill(d, half, q) * (n / case.n1) ** k * (1 if arm == "scratch" else -1)
    assert found["delta"] == pytest.approx(float(np.sum((runs.white[arm] @ move) ** 2)), rel=1e-9)


def test_a_bend_that_makes_a_loss_rise_or_a_larger_model_worse_is_no_twin() -> None:
    case = bench.draw_case(7, "transfer-ratio", 1.0, seed=0)
    assert twin._bent_valid(case, "scratch", 0.05, 1e7, 1.0, 4)
    assert not twin._bent_valid(case, "scratch", 2.0, 1e7, 1.0, 0)  # from scratch's loss climbs past 1e7 tokens
    assert not twin._bent_valid(case, "upcycled", 5.0, 1e7, 1.0, 0)  # upcycled falls through E
    assert not twin._bent_valid(case, "scratch", 0.1, 1e7, 1.0, 2)  # still falling, but the largest size ends worse


def test_a_bent_twins_runs_differ_from_t1s_by_the_bend_alone() -> None:
    case = bench.draw_case(7, "transfer-ratio", 1.0, seed=0)
    bend = {"arm": "scratch", "eps": 0.07, "half": 3e7, "q": 1.0, "k": 2}
    t1 = bench.tables(case)
    t2 = bench.tables(case, lambda family, kind: twin.BentLaw(family, kind, bend))
    assert np.array_equal(t1["dense"][LOSS], t2["dense"][LOSS]) and np.array_equal(t1["upcycled"][LOSS],
                                                                                    t2["upcycled"][LOSS])
    ratio = np.log(t2["scratch"][LOSS] / t1["scratch"][LOSS])
    size = (t1["scratch"]["N"] / bench.N1_REF) ** 2
    assert np.allclose(ratio, 0.07 * twin.hill(t1["scratch"]["D"], 3e7, 1.0) * size, rtol=1e-9, atol=0)


@pytest.mark.slow  # two bench runs: one truth through the analysis, then its bent twin through it
def test_late_twins_of_a_saved_run_with_the_analysis_on_the_one_that_caps_coverage(tmp_path) -> None:
    run, out = tmp_path / "run.json", tmp_path / "twins.json"
    bench.main(["--cases", "5", "--paper", "0", "--placements", "1", "--bootstrap", "4", "--json", str(run)])
    figures = twin.main([str(run), "--late", "--analyze", "1", "--bootstrap", "4", "--json", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    assert (row["family"], row["placement"], row["closest"]["arm"]) == ("effective", 1.0, "scratch")
    assert figures["all"]["twin_below_80"] == 1 and row["closest"]["max_coverage"] < 0.8
    (analysis,) = row["twin_analyses"]
    assert analysis["draw"] == 0 and figures["twin_analyses"] == {
        "n": 1, "covered_80": int(analysis["covered_80"]),
        "bounded_decade_80": int(analysis["width_80"] is not None and analysis["width_80"] <= 1)}
    with pytest.raises(SystemExit):
        twin.main([str(run), "--analyze", "1"])  # scoring the analysis needs the bent twins
