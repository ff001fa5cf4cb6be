"""The registry against docs/laws.md: every law is present, and predict() equals the formula written out by hand.

Strategy: exact identities. Each law's prediction on random (D, N, ...) and random parameters must equal an
independent numpy transcription of its docs/laws.md formula to 1e-12 relative; that pins the term declarations.
"""

import numpy as np
import pytest

from upscale.fitting.errors import FitError
from upscale.fitting.laws import LAWS, declare, get_law

RNG = np.random.default_rng(7)
COLS = {c: 10 ** RNG.uniform(lo, hi, 50) for c, (lo, hi) in
        {"D": (8, 12), "N": (6, 10), "D1": (8, 12), "D2": (8, 12), "N1": (6, 10), "N2": (6, 10)}.items()}
COLS["P"] = RNG.uniform(1.2, 64, 50)
P = {"A": 17.0, "B": 9.0, "F": 5.0, "E": 0.4, "alpha": 0.2, "beta": 0.15, "alpha1": 0.05, "alpha2": 0.1,
     "alpha3": 8e-4, "beta1": 0.3, "beta2": 0.2, "beta3": 0.004}
log = np.log


def formula(name: str, c: dict, p: dict) -> np.ndarray:
    D1, D2, N1, P_, N2 = c["D1"], c["D2"], c["N1"], c["P"], c["N2"]
    if name.endswith("-exact"):
        D2 = 1 + D2
        name = name.removesuffix("-exact")
    a1, a2, a3, b1, b2, b3 = p["alpha1"], p["alpha2"], p["alpha3"], p["beta1"], p["beta2"], p["beta3"]
    A, B, F, E = p["A"], p["B"], p["F"], p["E"]
    return {
        "chinchilla": A * c["D"] ** -p["alpha"] + B * c["N"] ** -p["beta"] + E,
        "data-mul": A * D1**-a1 * D2 ** (-a2 + a3 * log(D1)) + E,
        "data-mul-noint": A * D1**-a1 * D2**-a2 + E,
        "data-add": A * D1**-a1 + F * D2 ** (-a2 + a3 * log(D1)) + E,
        "data-add-noint": A * D1**-a1 + F * D2**-a2 + E,
        "config-add": A * P_**-b1 + F * N2**-b2 + E,
        "config-mul": A * P_**-b1 * N2 ** (-b2 + b3 * log(P_)) + E,
        "config-mul-noint": A * P_**-b1 * N2**-b2 + E,
        "config-add-int": A * P_**-b1 + F * N2 ** (-b2 + b3 * log(P_)) + E,
        "joint": A * D1**-a1 * D2 ** (-a2 + a3 * log(D1)) + B * N1 ** -p["beta"] + E,
        "joint-alt": A / D1**a1 + B / (D2**a2 * N1 ** (p["beta"] - a3 * log(D2))) + E,
    }[name]


def test_registry_has_every_law_of_laws_md_and_the_exact_variants():
    base = {"chinchilla", "data-mul", "data-mul-noint", "data-add", "data-add-noint", "config-add", "config-mul",
            "config-mul-noint", "config-add-int", "joint", "joint-alt"}
    exact = {f"{n}-exact" for n in base if "D2" in LAWS[n].columns}
    assert set(LAWS) == base | exact
    assert exact == {f"{n}-exact" for n in ("data-mul", "data-mul-noint", "data-add", "data-add-noint", "joint",
                                            "joint-alt")}


@pytest.mark.parametrize("name", sorted(LAWS))
def test_predict_equals_the_formula(name):
    law = LAWS[name]
    p = {k: P[k] for k in law.param_names}
    got = law.predict(p, {k: COLS[k] for k in law.columns})
    np.testing.assert_allclose(got, formula(name, COLS, P), rtol=1e-12)


def test_a_new_law_is_one_declaration():
    law = declare("toy", "test", "L = A·D^−alpha + E", ["A: -alpha*D", "E"], holdout="D")
    assert law.param_names == ("A", "alpha", "E") and law.columns == ("D",)
    np.testing.assert_allclose(law.predict({"A": 2.0, "alpha": 0.5, "E": 1.0}, {"D": np.array([4.0])}), [2.0])
    with pytest.raises(ValueError, match="bad monomial"):
        declare("bad", "test", "", ["A: alpha*D"], holdout="D")


def test_unknown_law_lists_the_valid_ones():
    with pytest.raises(FitError, match=r"unknown law 'jiont'; valid laws: chinchilla, .*joint"):
        get_law("jiont")
