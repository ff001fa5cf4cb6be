"""Compute-optimal upcycling: Appendix F.3's closed form against the numeric optimum of the same law."""

import numpy as np
import pytest

from upscale.fitting.errors import FitError
from upscale.fitting.laws import get_law
from upscale.fitting.optimal import closed_form, numeric
from upscale.fitting.summary import FittedLaw
from upscale.fitting.synthetic import TABLE2

UP = FittedLaw(get_law("joint"), TABLE2["upcycled"])


@pytest.mark.parametrize(("d1", "compute"), [(1e10, 1e20), (1e11, 1e21), (2e12, 1e22), (2e12, 1e24)])
def test_closed_form_and_numeric_agree_within_1_percent(d1, compute):
    cf, num = closed_form(UP, d1, compute), numeric(UP, d1, compute)
    assert cf.d2_tokens == pytest.approx(num.d2_tokens, rel=0.01)
    assert cf.n1_params == pytest.approx(num.n1_params, rel=0.01)
    # both spend exactly the budget: C2 = 6·(1.75·N1)·D2
    assert 10.5 * cf.n1_params * cf.d2_tokens == pytest.approx(compute, rel=1e-12)
    assert 10.5 * num.n1_params * num.d2_tokens == pytest.approx(compute, rel=1e-12)
    assert num.loss <= cf.loss + 1e-12  # the numeric optimum of the law cannot be beaten


def test_exponent_of_the_allocation_is_beta_over_alpha_eff_plus_beta():
    d1 = 2e12
    p = TABLE2["upcycled"]
    alpha_eff = p["alpha2"] - p["alpha3"] * np.log(d1)
    a = [closed_form(UP, d1, c).d2_tokens for c in (1e21, 1e23)]
    assert np.log(a[1] / a[0]) / np.log(100) == pytest.approx(p["beta"] / (alpha_eff + p["beta"]), rel=1e-9)


def test_closed_form_needs_the_joint_law_and_a_positive_alpha_eff():
    alt = FittedLaw(get_law("joint-alt"), {"A": 16.0, "alpha1": 0.04, "B": 8.0, "alpha2": 0.08, "beta": 0.1,
                                           "alpha3": 1e-3, "E": 0.2})
    with pytest.raises(FitError, match="closed form needs a fit of law 'joint'"):
        closed_form(alt, 1e10, 1e21)
    assert numeric(alt, 1e10, 1e21).loss > 0.2
    with pytest.raises(FitError, match="alpha_eff"):
        closed_form(FittedLaw(UP.law, {**UP.params, "alpha3": 0.01}), 1e12, 1e21)
