"""D*, catch-up budget and verdict against the paper's Table 2 parameters (docs/laws.md, "D*").

Strategy: the rounded Table 2 laws must cross at 3.0e9 tokens for N1 = 1e9 (within 1%) and again near 5e11;
the catch-up budget must solve its equation to machine precision; the closed form must recover its own
coefficients; bootstrap samples must turn into an interval and a probability.
"""

import numpy as np
import pytest

from upscale.fitting.dstar import (
    catch_up,
    check_pair,
    closed_form_dstar,
    crossings,
    decide,
    dstar_samples,
    fit_closed_form,
    moe_loss,
    upcycled_loss,
)
from upscale.fitting.errors import FitError
from upscale.fitting.laws import get_law
from upscale.fitting.summary import FittedLaw
from upscale.fitting.synthetic import TABLE2

MOE = FittedLaw(get_law("chinchilla"), TABLE2["moe"])
UP = FittedLaw(get_law("joint"), TABLE2["upcycled"])


def test_table2_dstar_at_1e9_and_the_second_crossing():
    c = crossings(MOE, UP, 1e9)
    assert c.dstar == pytest.approx(3.0e9, rel=0.01)
    assert len(c.crossings) == 2 and 4e11 < c.crossings[1] < 6e11
    assert [side for _, _, side in c.segments] == ["upcycle", "scratch", "upcycle"]
    # at a crossing the two losses are equal
    for d in c.crossings:
        assert moe_loss(MOE, 1e9, d)[0] == pytest.approx(upcycled_loss(UP, 1e9, d, d)[0], rel=1e-10)


def test_dstar_falls_with_model_size_and_the_closed_form_recovers_its_coefficients():
    n1 = np.geomspace(3e8, 1e11, 8)
    ds = np.array([crossings(MOE, UP, n).dstar for n in n1])
    assert np.all(np.diff(ds) < 0)
    truth = {"a": 4e9, "b": -0.7, "c": 0.04}
    got = fit_closed_form(n1, closed_form_dstar(truth, n1))
    assert got["a"] == pytest.approx(4e9, rel=1e-9) and got["b"] == pytest.approx(-0.7, abs=1e-9)
    assert got["c"] == pytest.approx(0.04, abs=1e-9)
    cf = fit_closed_form(n1, ds)  # the Table 2 laws in the paper's form: within 10% over this range
    np.testing.assert_allclose(closed_form_dstar(cf, n1), ds, rtol=0.1)
    with pytest.raises(FitError, match="finite at only 2"):
        fit_closed_form(n1[:3], np.array([1e9, 2e9, np.inf]))


def test_catch_up_budget_solves_its_equation_and_the_verdict_follows_the_paper():
    n1, d1, d2 = 1e9, 1e9, 1e9
    d_moe = catch_up(MOE, UP, n1, d1, d2)
    assert moe_loss(MOE, n1, d_moe)[0] == pytest.approx(upcycled_loss(UP, n1, d1, d2)[0], rel=1e-10)
    assert decide(MOE, UP, n1, d1, d2).verdict == ("upcycle" if d_moe > d1 else "scratch")
    # below D* upcycling wins, between the crossings from scratch does (D1 = D2 = D, as Eq. 13)
    assert decide(MOE, UP, 1e9, 1e9, 1e9).verdict == "upcycle"
    assert decide(MOE, UP, 1e9, 3e10, 3e10).verdict == "scratch"
    # the upcycled 1e9 model after 1e15 + 1e15 tokens is below the from-scratch floor B·N1^−beta + E: never caught up
    assert catch_up(MOE, UP, n1, 1e15, 1e15) == float("inf")


def test_bootstrap_samples_give_an_interval_and_a_probability():
    rng = np.random.default_rng(0)
    jitter = 1 + 0.02 * rng.standard_normal((50, 1))  # the upcycled A varies by 2% across samples
    moe_row = [TABLE2["moe"][n] for n in MOE.law.param_names]
    moe = FittedLaw(MOE.law, MOE.params, np.array([moe_row]) * np.ones((50, 1)))
    up_rows = np.array([[TABLE2["upcycled"][n] for n in UP.law.param_names]]) * np.ones((50, 1))
    up_rows[:, UP.law.param_names.index("A")] *= jitter[:, 0]
    up = FittedLaw(UP.law, UP.params, up_rows)
    samples = dstar_samples(moe, up, 1e9)
    assert samples.shape == (50,) and samples.min() < 3.0e9 < samples.max()
    d = decide(moe, up, 1e9, 2.5e9, 2.5e9)
    out = d.to_json()
    ivs = out["catch_up_intervals"]
    assert 0 < d.probability_upcycle < 1
    assert ivs["95"]["low"] <= ivs["80"]["low"] < d.catch_up_tokens < ivs["80"]["high"] <= ivs["95"]["high"]
    assert set(out) == {"n1", "d1", "d2", "loss_upcycled", "catch_up_tokens", "catch_up_state", "tokens_saved",
                        "verdict", "probability_upcycle", "decisive", "catch_up_intervals", "extrapolation"}
    # a probability between 1 - DECISIVE and DECISIVE is no verdict either way
    assert out["verdict"] == ("undecided" if 0.2 < d.probability_upcycle < 0.8 else
                              "upcycle" if d.probability_upcycle >= 0.8 else "scratch")


def test_the_pair_must_be_a_moe_law_and_an_upcycled_law():
    with pytest.raises(FitError, match="the MoE fit must be of a \\(D, N\\) law"):
        check_pair(UP, UP)
    with pytest.raises(FitError, match="--d2 must be a positive number"):
        decide(MOE, UP, 1e9, 1e9, -1.0)
