"""Comparison: the generating law wins on LOO, extrapolation and AIC/BIC; errors are in loss units.

Strategy: data from data-mul (with the interaction) are compared against data-mul-noint; LOO RMS must match the
noise level (0.5% of the loss), and a noise-free table gives LOO ≈ 0. A LOO refit that fails (injected by patching
``refit_theta`` for chosen rows: the real fault is rare) is skipped and counted, and never costs a law its row.
"""

import json

import numpy as np
import pytest

from tests.fitting.faults import failing_loo_rows
from upscale.fitting.compare import MAX_LOO_FAILED, compare, leave_one_out
from upscale.fitting.fit import FitOptions, fit_problem, prepare, refit_theta
from upscale.fitting.laws import get_law
from upscale.fitting.synthetic import design, generate

TRUTH = {"A": 20.0, "alpha1": 0.1, "alpha2": 0.3, "alpha3": 4e-3, "E": 0.5}
GRID = {"D1": tuple(np.geomspace(1e7, 1e12, 8)), "D2": tuple(np.geomspace(1e6, 1e12, 8))}


def test_the_generating_law_wins_and_loo_is_in_loss_units():
    law = get_law("data-mul")
    df = generate(law, TRUTH, design(law, GRID), noise=0.005, seed=11)
    rows = compare([law, get_law("data-mul-noint")], df)
    good, bad = rows
    assert (good.law, bad.law) == ("data-mul", "data-mul-noint") and good.n_free == 5 and bad.n_free == 4
    assert good.loo_rms < bad.loo_rms and good.aic < bad.aic and good.bic < bad.bic
    assert good.extrapolation_rms < bad.extrapolation_rms
    noise_in_loss_units = 0.005 * df["loss"].mean()
    assert 0.5 * noise_in_loss_units < good.loo_rms < 2 * noise_in_loss_units


def test_loo_is_zero_on_noise_free_data_and_json_has_no_nan():
    law = get_law("data-mul")
    df = generate(law, TRUTH, design(law, GRID), noise=0.0)
    (row,) = compare([law], df)
    assert row.loo_rms == pytest.approx(0.0, abs=1e-5)
    assert set(row.to_json()) == {"law", "n_points", "n_free", "objective", "loo_rms", "extrapolation_rms", "aic",
                                  "bic", "loo_failed", "loo_failed_rows", "loo_note"}
    assert (row.loo_failed, row.loo_failed_rows, row.loo_note) == (0, (), None)


SMALL = {"D1": tuple(np.geomspace(1e7, 1e12, 5)), "D2": tuple(np.geomspace(1e6, 1e12, 5))}  # 25 points


def manual_loo(law, df, skip):
    """LOO RMS in loss units over the rows not in ``skip`` (1-based), refit by hand."""
    options = FitOptions()
    problem, table = prepare(law, df, None, options)
    best = fit_problem(law, problem, table, None, options).best
    everything = np.arange(problem.n)
    errors = []
    for i in everything:
        if i + 1 in skip:
            continue
        t = refit_theta(problem.subset(np.delete(everything, i)), best, options)
        errors.append(np.exp(problem.subset(np.array([i])).log_predict(t)[0]) - df["loss"].iloc[i])
    return float(np.sqrt(np.mean(np.square(errors))))


@pytest.mark.parametrize("how", ["raise", "none", "nan"])
def test_a_failed_loo_refit_is_counted_and_the_rest_still_reported(monkeypatch, how):
    law = get_law("data-mul")
    df = generate(law, TRUTH, design(law, SMALL), noise=0.005, seed=3)
    expected = manual_loo(law, df, {4})
    failing_loo_rows(monkeypatch, df["loss"].to_numpy(), [4], how)
    (row,) = compare([law], df)
    assert (row.loo_failed, row.loo_failed_rows) == (1, (4,))
    assert row.loo_rms == pytest.approx(expected, rel=1e-6)
    assert row.loo_note.startswith("1 of 25 leave-one-out refits did not converge (without row 4 (D1=")
    assert "LOO RMS is over the other 24" in row.loo_note
    out = json.loads(json.dumps(row.to_json(), allow_nan=False))
    assert out["loo_failed"] == 1 and out["loo_failed_rows"] == [4] and out["loo_rms"] == pytest.approx(expected)


def test_loo_rms_is_not_reported_past_a_quarter_failed(monkeypatch):
    law = get_law("data-mul")
    df = generate(law, TRUTH, design(law, SMALL), noise=0.005, seed=3)
    options = FitOptions()
    problem, table = prepare(law, df, None, options)
    best = fit_problem(law, problem, table, None, options).best
    limit = int(MAX_LOO_FAILED * 25)  # 6 of 25 may fail, 7 may not
    failing_loo_rows(monkeypatch, df["loss"].to_numpy(), range(1, limit + 1))
    kept = leave_one_out(problem, best, options)
    assert kept.failed == limit and np.isfinite(kept.rms) and kept.reported == kept.rms
    failing_loo_rows(monkeypatch, df["loss"].to_numpy(), range(1, limit + 2))
    lost = leave_one_out(problem, best, options)
    assert lost.failed == limit + 1 and lost.failed_rows == tuple(range(1, limit + 2)) and lost.reported is None
    assert "so LOO RMS is not reported" in lost.note and "and 2 more" in lost.note


def test_one_law_losing_its_loo_leaves_the_others_compared(monkeypatch):
    law, other = get_law("data-mul"), get_law("data-mul-noint")
    df = generate(law, TRUTH, design(law, SMALL), noise=0.005, seed=3)
    clean_rows = compare([law, other], df)
    failing_loo_rows(monkeypatch, df["loss"].to_numpy(), range(1, 26), n_free=4)  # every refit of data-mul-noint
    good, bad = compare([law, other], df)
    assert (good.law, bad.law) == ("data-mul", "data-mul-noint")
    assert good == clean_rows[0]  # untouched, to the last digit
    assert bad.loo_failed == 25 and np.isnan(bad.loo_rms) and "not reported" in bad.loo_note
    assert (bad.objective, bad.aic, bad.extrapolation_rms) == (clean_rows[1].objective, clean_rows[1].aic,
                                                               clean_rows[1].extrapolation_rms)
    assert bad.to_json()["loo_rms"] is None


def test_loo_above_its_held_out_count_leaves_out_a_seeded_sample():
    """The cost of LOO is one refit per row left out: above ``held_out`` rows only a seeded sample is, the same one
    for the same seed, and the result says so."""
    law = get_law("data-mul")
    df = generate(law, TRUTH, design(law, SMALL), noise=0.005, seed=3)
    options = FitOptions()
    problem, table = prepare(law, df, None, options)
    best = fit_problem(law, problem, table, None, options).best
    whole = leave_one_out(problem, best, options)
    sample = leave_one_out(problem, best, options, held_out=10, seed=1)
    assert (whole.sampled, sample.sampled, sample.n) == (None, 10, 25) and np.isfinite(sample.rms)
    assert sample.note == "LOO RMS over a seeded sample of 10 of the 25 rows, left out in turn"
    assert leave_one_out(problem, best, options, held_out=10, seed=1).rms == sample.rms
    assert leave_one_out(problem, best, options, held_out=25).sampled is None  # not more rows than that: all
