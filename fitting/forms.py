"""The law forms an answer weighs: several ways the loss may depend on tokens and size, for each arm.

One law fitted to a grid says nothing about the error of its own form, and that error is the one that decides an
extrapolation (docs/laws.md, "The answer beyond one law"). So each arm is fitted by several forms that agree inside the
grid and part beyond it, and the backtests (fitting/backtest.py) weigh them by how well they predicted runs they did not
see. The forms and why each is there:

from scratch, (D, N):
- ``chinchilla``: A·D^−α + B·N^−β + E, the paper's MoE law (data and size add).
- ``chinchilla-int``: A·D^(−α + α3·ln N) + B·N^−β + E: the data exponent moves with size, as it does when a
  larger model uses its tokens better (or worse) than the smaller ones suggest.

upcycled, (D1, D2, N1):
- ``joint``: the paper's Eq. 12, A·D1^−α1·D2^(−α2 + α3·ln D1) + B·N1^−β + E.
- ``joint-saturating``: Eq. 12 with its D2 exponent held at zero past D1 = exp(α2/α3), where Eq. 12's own exponent
  would turn negative (loss rising with D2), and its D1 exponent held at zero past D2 = exp(α1/α3) likewise. It has
  Eq. 12's fitted parameters (the two agree wherever the grid lies below those points) and differs only beyond
  them: the reading of the interaction as saturation.
- ``joint-noint``: A·D1^−α1·D2^−α2 + B·N1^−β + E: dense and MoE tokens multiply with fixed exponents, no
  interaction; never turns.
- ``joint-additive``: A·D1^−α1 + F·D2^−α2 + B·N1^−β + E: dense and MoE tokens each lower the loss on their own
  (the paper's Eq. 9 without interaction, with the size term).
- ``joint-alt``: the paper's Eq. 19, where size, not dense tokens, sets how fast MoE tokens help.

Every form reads the same columns as the law it stands beside, so D*, backtests and bands treat them alike; a
form is evaluated for many parameter rows at once (fits and bootstrap samples) as log L̂.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy.special import logsumexp

from upscale.fitting.laws import Law, declare, get_law

ARMS = ("scratch", "upcycled")
TURN_SLOPE = 1e-9  # d log L / d log D above this is a loss rising with tokens: the form has turned there


@dataclass(frozen=True)
class Form:
    """One law form of one arm: the law that is fitted, and whether its D2 exponent saturates at zero."""

    name: str
    arm: str  # "scratch" | "upcycled"
    law: Law
    saturating: bool = False

    def log_losses(self, rows: np.ndarray, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        """log L̂ as (point, parameter row), for parameter rows in user units (the law's parameter order)."""
        rows = np.atleast_2d(np.asarray(rows, dtype=float))
        X = self.law.design(columns)  # (term, point, parameter)
        Z = np.einsum("knp,rp->knr", X, self.law.fitted_rows(rows))
        if self.saturating:
            Z[0] -= self._beyond_turn(rows, columns)
        with np.errstate(over="ignore"):
            return logsumexp(Z, axis=0)

    def _beyond_turn(self, rows: np.ndarray, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        """What Eq. 12's interaction α3·ln D1·ln D2 adds beyond its turning points, per (point, row): the
        interaction with ln D1 held at α2/α3 (where the D2 exponent reaches zero) and ln D2 held at α1/α3 (where the
        D1 exponent does), subtracted from the interaction itself. Zero below both points and where α3 ≤ 0."""
        names = self.law.param_names
        a1, a2, a3 = (rows[:, names.index(n)] for n in ("alpha1", "alpha2", "alpha3"))
        rising = a3 > 0
        safe = np.where(rising, a3, 1.0)
        t1, t2 = np.where(rising, a2 / safe, np.inf), np.where(rising, a1 / safe, np.inf)
        x1 = self.law.log_column("D1", columns["D1"])[:, None]
        x2 = self.law.log_column("D2", columns["D2"])[:, None]
        held = np.minimum(x1, t1[None, :]) * np.minimum(x2, t2[None, :])
        return np.where(rising, a3, 0.0)[None, :] * (x1 * x2 - held)


_CHINCHILLA_INT = declare("chinchilla-int", "Chinchilla with a size-dependent data exponent",
                          "L = A·D^(−alpha + alpha3·log N) + B·N^−beta + E",
                          ["A: -alpha*D +alpha3*D*N", "B: -beta*N", "E"], holdout="N")
_JOINT_NOINT = declare("joint-noint", "Eq. 12 with alpha3 = 0", "L = A·D1^−alpha1·D2^−alpha2 + B·N1^−beta + E",
                       ["A: -alpha1*D1 -alpha2*D2", "B: -beta*N1", "E"], holdout="N1")
_JOINT_ADDITIVE = declare("joint-additive", "Eq. 9 without interaction, with the size term",
                          "L = A·D1^−alpha1 + F·D2^−alpha2 + B·N1^−beta + E",
                          ["A: -alpha1*D1", "F: -alpha2*D2", "B: -beta*N1", "E"], holdout="N1")

FORMS: dict[str, tuple[Form, ...]] = {
    "scratch": (Form("chinchilla", "scratch", get_law("chinchilla")),
                Form("chinchilla-int", "scratch", _CHINCHILLA_INT)),
    "upcycled": (Form("joint", "upcycled", get_law("joint")),
                 Form("joint-saturating", "upcycled", get_law("joint"), saturating=True),
                 Form("joint-noint", "upcycled", _JOINT_NOINT),
                 Form("joint-additive", "upcycled", _JOINT_ADDITIVE),
                 Form("joint-alt", "upcycled", get_law("joint-alt"))),
}
PRIMARY = {"scratch": "chinchilla", "upcycled": "joint"}  # the paper's forms: the analysis's fits are theirs


def form(arm: str, name: str) -> Form:
    for f in FORMS[arm]:
        if f.name == name:
            return f
    raise KeyError(f"no {arm} form {name!r}; the {arm} forms are {', '.join(f.name for f in FORMS[arm])}")


def path_columns(arm: str, n1: float, tokens: np.ndarray, d1: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The columns of a point on the D* path at size ``n1``: D = ``tokens`` from scratch; D1 = D2 = ``tokens``
    upcycled (``d1`` overrides D1: a verdict's fixed dense budget)."""
    t = np.asarray(tokens, dtype=float)
    if arm == "scratch":
        return {"D": t, "N": np.full(t.shape, n1)}
    return {"D1": t if d1 is None else np.broadcast_to(d1, t.shape).astype(float), "D2": t, "N1": np.full(t.shape, n1)}


def turned(f: Form, rows: np.ndarray, n1: float, tokens: np.ndarray, d1: float | None = None) -> np.ndarray:
    """(point, row): True where the form's loss no longer falls with tokens at that point of the D* path (``d1``:
    of a verdict's path, D1 fixed): along the path itself, and for the upcycled arm along D2 and along D1 alone.
    Past such a point the form is not used (fitting/answer.py stops the search there with the reason)."""
    h = 1e-3
    cols = path_columns(f.arm, n1, tokens, d1)
    base = f.log_losses(rows, cols)
    moves = [{**cols, "D": cols["D"] * np.exp(h)}] if f.arm == "scratch" else [
        {**cols, "D1": cols["D1"] * np.exp(h), "D2": cols["D2"] * np.exp(h)},
        {**cols, "D2": cols["D2"] * np.exp(h)},
        {**cols, "D1": cols["D1"] * np.exp(h)}]
    out = np.zeros(base.shape, dtype=bool)
    for moved in moves:
        with np.errstate(invalid="ignore"):
            out |= ~((f.log_losses(rows, moved) - base) / h < TURN_SLOPE)
    return out
