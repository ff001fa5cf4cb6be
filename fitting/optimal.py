"""Compute-optimal upcycling (Eq. 14, Appendix F.3): split a FLOP budget C2 between N1 and D2 for a given D1.

C2 = 6·N2·D2 with N2 = 1.75·N1 (8×2 Mixtral-like; ``active_ratio``), so N1·D2 = C2/10.5 = K. For `joint` the
optimum is closed-form: D2 = G·K^a, N1 = K/D2 with α_eff = α2 − α3·log D1, A_eff = A·D1^−α1,
G = (A_eff·α_eff/(B·β))^(1/(α_eff+β)), a = β/(α_eff+β). The numeric optimum minimises the fitted law itself
along N1·D2 = K (any (D1, D2, N1) law); the two agree for `joint`, which the tests check.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize_scalar

from upscale.fitting.dstar import upcycled_loss
from upscale.fitting.errors import FitError
from upscale.fitting.summary import FittedLaw

ACTIVE_RATIO = 1.75  # N2/N1 for 8 experts, top-2 (Eq. 5: (4 + 12·2)/16)


@dataclass(frozen=True)
class Allocation:
    d2_tokens: float
    n1_params: float
    loss: float


def closed_form(up: FittedLaw, d1: float, compute: float, active_ratio: float = ACTIVE_RATIO) -> Allocation:
    """Appendix F.3's formula; needs the `joint` law's parameters."""
    p = up.params
    if not {"A", "alpha1", "alpha2", "alpha3", "B", "beta"} <= p.keys() or up.law.name.startswith("joint-alt"):
        raise FitError(f"the closed form needs a fit of law 'joint', not {up.law.name!r}; use the numeric optimum")
    a_eff = p["A"] * d1 ** -p["alpha1"]
    alpha_eff = p["alpha2"] - p["alpha3"] * np.log(d1)
    if alpha_eff <= 0:
        raise FitError(f"alpha_eff = alpha2 - alpha3·log D1 = {alpha_eff:.4g} <= 0 at D1 = {d1:g}: "
                       "more D2 never pays, there is no optimum")
    k = compute / (6 * active_ratio)
    s = alpha_eff + p["beta"]
    g = (a_eff * alpha_eff / (p["B"] * p["beta"])) ** (1 / s)
    d2 = g * k ** (p["beta"] / s)
    n1 = k ** (alpha_eff / s) / g
    return Allocation(float(d2), float(n1), float(upcycled_loss(up, n1, d1, d2)[0]))


def numeric(up: FittedLaw, d1: float, compute: float, active_ratio: float = ACTIVE_RATIO) -> Allocation:
    """Minimise L(D1, K/N1, N1) over log N1 (bounded Brent, N1 from 1e3 up to K/1e3 tokens)."""
    k = compute / (6 * active_ratio)
    if not (np.isfinite(k) and k > 1e7):
        raise FitError(f"--compute {compute:g} FLOPs is too small to train anything; give C2 in FLOPs, e.g. 1e21")

    def loss(u: float) -> float:
        n1 = np.exp(u)
        return float(upcycled_loss(up, n1, d1, k / n1)[0])

    res = minimize_scalar(loss, bounds=(np.log(1e3), np.log(k / 1e3)), method="bounded",
                          options={"xatol": 1e-10, "maxiter": 500})
    n1 = float(np.exp(res.x))
    return Allocation(k / n1, n1, float(res.fun))
