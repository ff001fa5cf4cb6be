"""The α(D1) and A(D1) check (Eq. 10, Eq. 16, Fig. 4): is the interaction form of the data law warranted?

Each D1 slice of an upcycled table (and each N1, when the table has several) gets its own single-variable fit
L = A·D2^−α + E (E fixed to the joint fit's value when given, as the paper does, since E is poorly pinned by one
slice). Then −α(D1) = γ·log D1 + E' and log A(D1) = −η·log D1 + c are fitted by least squares: γ > 0 means the
effective exponent falls with sunk cost (the paper's α3), η is Eq. 16's exponent.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from upscale.fitting.errors import FitError
from upscale.fitting.fit import FitOptions, fit
from upscale.fitting.laws import LOSS, POWER_D2


@dataclass(frozen=True)
class AlphaDiagnostics:
    slices: pd.DataFrame  # one row per (N1, D1): N1, D1, A, alpha, E, n_points
    gamma: float  # slope of −α against log D1
    e_prime: float  # its intercept
    eta: float  # A(D1) ∝ D1^−η
    log_a0: float


def alpha_d1(df: pd.DataFrame, E: float | None = None, options: FitOptions | None = None) -> AlphaDiagnostics:
    """Per-slice fits and the linear trends of −α and log A in log D1 (pooled over N1)."""
    missing = [c for c in ("D1", "D2", LOSS) if c not in df.columns]
    if missing:
        raise FitError(f"the alpha(D1) diagnostic needs column(s) {', '.join(missing)}")
    keys = ["N1", "D1"] if "N1" in df.columns else ["D1"]
    fixed = {"E": E} if E is not None else {}
    n_free = len(POWER_D2.params) - len(fixed)
    rows = []
    for key, part in df.groupby(keys, sort=True):
        if len(part) <= n_free:
            continue
        values = dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True))
        r = fit(POWER_D2, part.reset_index(drop=True), fixed, options)
        rows.append({"N1": values.get("N1", np.nan), "D1": values["D1"], "A": r.params["A"],
                     "alpha": r.params["alpha"], "E": r.params["E"], "n_points": len(part)})
    slices = pd.DataFrame(rows)
    if len(slices) < 2 or slices["D1"].nunique() < 2:
        raise FitError(f"the alpha(D1) diagnostic needs at least 2 D1 values with more than {n_free} points each")
    x = np.log(slices["D1"].to_numpy())
    design = np.column_stack([x, np.ones_like(x)])
    (gamma, e_prime), *_ = np.linalg.lstsq(design, -slices["alpha"].to_numpy(), rcond=None)
    (slope, log_a0), *_ = np.linalg.lstsq(design, np.log(slices["A"].to_numpy()), rcond=None)
    return AlphaDiagnostics(slices, float(gamma), float(e_prime), float(-slope), float(log_a0))
