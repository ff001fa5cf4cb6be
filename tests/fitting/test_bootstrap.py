"""Bootstrap: cluster resampling over trunks, determinism (seed and process count), and coverage of the truth.

Strategy: synthetic chinchilla tables from the paper's MoE parameters with 0.5% noise; the 95% intervals of 200
refits must contain every generating parameter; the same seed must give identical samples with 1 or 2 processes.
A refit that fails (injected: raised, not converged, NaN) is counted and left out, never fatal.
"""

import numpy as np
import pytest

from tests.fitting.faults import failing_calls
from upscale.fitting.bootstrap import bootstrap, percentile_interval
from upscale.fitting.fit import fit
from upscale.fitting.laws import TRUNK, get_law
from upscale.fitting.synthetic import TABLE2, design, generate

LAW = get_law("chinchilla")
GRID = {"D": tuple(np.geomspace(1e8, 1e12, 8)), "N": tuple(np.geomspace(1e7, 1e10, 8))}


def table(seed: int = 5):
    return generate(LAW, TABLE2["moe"], design(LAW, GRID), noise=0.005, seed=seed)


def test_bootstrap_intervals_contain_the_truth():
    # 3 independent tables x 5 parameters = 15 95%-intervals: ~0.75 misses expected, at most 1 allowed
    covered = []
    for seed in range(3):
        df = table(seed).drop(columns=TRUNK)  # point noise only: the point bootstrap is the right one
        result = fit(LAW, df)
        boot = bootstrap(LAW, df, result, n=100, seed=1)
        assert boot.unit == "point" and boot.n_failed == 0 and boot.samples.shape == (100, 5)
        for name, (lo, hi) in boot.ci().items():
            covered.append(lo <= TABLE2["moe"][name] <= hi)
            assert lo <= result.params[name] <= hi
    assert sum(covered) >= 14, covered


def test_cluster_bootstrap_resamples_whole_trunks():
    df = table()
    result = fit(LAW, df)
    boot = bootstrap(LAW, df, result, n=20, seed=3)
    n_trunks = df[TRUNK].nunique()
    assert boot.unit == "trunk" and boot.draws.shape == (20, n_trunks) == (20, 8)
    # a draw picks trunks with replacement: some trunk appears twice in most draws
    assert np.mean([len(set(d)) < n_trunks for d in boot.draws]) > 0.9


def test_same_seed_same_samples_for_any_number_of_processes():
    df = table()
    result = fit(LAW, df)
    a = bootstrap(LAW, df, result, n=24, seed=9)
    b = bootstrap(LAW, df, result, n=24, seed=9, workers=2)
    np.testing.assert_array_equal(a.samples, b.samples)
    np.testing.assert_array_equal(a.draws, b.draws)
    assert not np.array_equal(a.draws, bootstrap(LAW, df, result, n=24, seed=10).draws)


def test_percentile_interval_keeps_infinities_and_ignores_nan():
    assert percentile_interval(np.arange(1.0, 101.0)) == (3.0, 98.0)
    lo, hi = percentile_interval(np.array([1.0, 2.0, np.inf, np.inf, np.nan]), level=0.5)
    assert lo == 1.0 and hi == np.inf
    assert percentile_interval(np.array([np.nan])) == pytest.approx((np.nan, np.nan), nan_ok=True)


def test_failed_refits_are_counted_and_left_out(monkeypatch):
    df = table()
    result = fit(LAW, df)
    clean = bootstrap(LAW, df, result, n=12, seed=9)
    assert clean.n_failed == 0 and clean.failed == () and clean.to_json()["failed"] == []
    failing_calls(monkeypatch, {2: "raise", 5: "none", 11: "nan"})
    boot = bootstrap(LAW, df, result, n=12, seed=9)
    assert boot.n_failed == 3 and boot.failed == (2, 5, 11) and boot.samples.shape == (9, 5)
    np.testing.assert_array_equal(boot.samples, np.delete(clean.samples, [2, 5, 11], axis=0))
    np.testing.assert_array_equal(boot.draws, clean.draws)
    assert boot.to_json()["n_failed"] == 3 and boot.to_json()["failed"] == [2, 5, 11]
    failing_calls(monkeypatch, dict.fromkeys(range(4), "raise"))
    none = bootstrap(LAW, df, result, n=4, seed=9)
    assert none.n_failed == 4 and none.samples.shape == (0, 5)
    assert all(np.isnan(lo) and np.isnan(hi) for lo, hi in none.ci().values())
