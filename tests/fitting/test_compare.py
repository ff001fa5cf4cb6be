"""Comparison: the generating law wins on LOO, extrapolation and AIC/BIC; errors are in loss units.

Strategy: data from data-mul (with the interaction) are compared against data-mul-noint; LOO RMS must match the
noise level (0.5% of the loss), and a noise-free table gives LOO ≈ 0.
"""

import numpy as np
import pytest

from upscale.fitting.compare import compare
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
                                  "bic"}
