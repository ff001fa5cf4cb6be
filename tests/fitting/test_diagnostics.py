"""alpha(D1)/A(D1) diagnostics: on data-mul data the per-slice exponent is alpha2 − alpha3·log D1 exactly, so the
linear fit must return gamma = alpha3 and E' = −alpha2, and A(D1) = A·D1^−alpha1 gives eta = alpha1."""

import numpy as np
import pytest

from upscale.fitting.diagnostics import alpha_d1
from upscale.fitting.errors import FitError
from upscale.fitting.laws import get_law
from upscale.fitting.synthetic import design, generate

TRUTH = {"A": 20.0, "alpha1": 0.1, "alpha2": 0.3, "alpha3": 4e-3, "E": 0.5}


def test_gamma_and_eta_are_the_interaction_and_the_d1_exponent():
    law = get_law("data-mul")
    grid = {"D1": tuple(np.geomspace(1e8, 1e12, 5)), "D2": tuple(np.geomspace(1e6, 1e12, 9))}
    df = generate(law, TRUTH, design(law, grid), noise=0.0)
    diag = alpha_d1(df, E=0.5)
    assert len(diag.slices) == 5
    np.testing.assert_allclose(diag.slices["alpha"], 0.3 - 4e-3 * np.log(diag.slices["D1"]), rtol=1e-5)
    assert diag.gamma == pytest.approx(4e-3, rel=1e-4) and diag.e_prime == pytest.approx(-0.3, rel=1e-4)
    assert diag.eta == pytest.approx(0.1, rel=1e-4) and np.exp(diag.log_a0) == pytest.approx(20.0, rel=1e-3)


def test_needs_two_d1_values():
    law = get_law("data-mul")
    df = generate(law, TRUTH, design(law, {"D1": (1e9,), "D2": tuple(np.geomspace(1e6, 1e12, 9))}), noise=0.0)
    with pytest.raises(FitError, match="at least 2 D1 values"):
        alpha_d1(df, E=0.5)
