"""D*, the catch-up budget and the verdict: where training the MoE from scratch overtakes upcycling.

D* (Eq. 13) solves L_MoE(N1, D) = L_upcycled(D1 = D, D2 = D, N1): the MoE law is fitted on (D, N) with N = N1
(as the paper's Table 2), the upcycled law on (D1, D2, N1). The gap L_MoE − L_upcycled is scanned on a log grid
and every sign change is refined with brentq, because the laws can cross twice (with the paper's Table 2
parameters at N1 = 1e9: ~3e9 and ~5e11 tokens). D* is the first crossing where upcycling stops winning.

Catch-up budget: for a user's (N1, D1, D2), the D_MoE at which from-scratch training reaches the upcycled loss.
The verdict follows the paper (Fig. 15, Sec. 5.1): upcycling is efficient when D_MoE exceeds the sunk cost D1.
``dstar_results`` is the `upscale dstar` JSON (``dstar_at``: D* and its interval at one N1; the closed form D*(N1)).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import brentq

from upscale.fitting.bootstrap import percentile_interval
from upscale.fitting.errors import FitError
from upscale.fitting.laws import Design, Law
from upscale.fitting.summary import FittedLaw, finite_or_none

TOKEN_RANGE = (1e6, 1e16)  # where crossings are searched: far beyond any training run at both ends
N1_RANGE = (1e8, 1e11)  # model sizes over which the closed form D*(N1) is fitted (the paper's Fig. 1 span)
_GRID = 400
_ROWS = 1024  # parameter rows put through the grid at once: ~terms x 400 x 1024 floats (10 MB) per law


def check_pair(moe: FittedLaw, upcycled: FittedLaw) -> None:
    """The MoE fit must be on (D, N) and the upcycled fit on (D1, D2, N1)."""
    if set(moe.law.columns) != {"D", "N"}:
        raise FitError(f"the MoE fit must be of a (D, N) law such as 'chinchilla', not {moe.law.name!r}")
    if set(upcycled.law.columns) != {"D1", "D2", "N1"}:
        raise FitError(f"the upcycled fit must be of a (D1, D2, N1) law such as 'joint', not {upcycled.law.name!r}")


def moe_loss(moe: FittedLaw, n1: float, tokens: np.ndarray, params: dict[str, float] | None = None) -> np.ndarray:
    t = np.atleast_1d(np.asarray(tokens, dtype=float))
    return moe.law.predict(params or moe.params, {"D": t, "N": np.full(t.shape, n1)})


def upcycled_loss(up: FittedLaw, n1: float, d1: np.ndarray, d2: np.ndarray,
                  params: dict[str, float] | None = None) -> np.ndarray:
    d1, d2 = np.broadcast_arrays(np.atleast_1d(np.asarray(d1, float)), np.atleast_1d(np.asarray(d2, float)))
    return up.law.predict(params or up.params, {"D1": d1, "D2": d2, "N1": np.full(d1.shape, n1)})


class _Curve:
    """One law along the D* path at model size N1, for rows of parameters (the fit, bootstrap samples): its design
    planned once per N1 and its parameters converted once, where Law.predict redid both at every grid point, brentq
    step and sample. ``loss`` (one row) is Law.predict's to the bit; ``losses`` (a block of rows at once) may differ
    from it in the last bit, which is harmless where it is used: for the signs of the gap on the grid."""

    def __init__(self, law: Law, size_column: str, n1: float, rows: np.ndarray) -> None:
        self.design = Design(law, {size_column: n1})
        self.theta = law.fitted_rows(rows)

    def loss(self, X: np.ndarray, row: int) -> np.ndarray:
        """L̂ at the design's rows for parameter row ``row``."""
        return np.exp(X @ self.theta[row]).sum(axis=0)

    def losses(self, X: np.ndarray, rows: slice) -> np.ndarray:
        """L̂ (design row, parameter row) for a block of parameter rows: one matrix product (2-D: BLAS's gemm)."""
        K, n, p = X.shape
        return np.exp((X.reshape(K * n, p) @ self.theta[rows].T).reshape(K, n, -1)).sum(axis=0)


def _fit_row(fitted: FittedLaw, params: dict[str, float] | None = None) -> np.ndarray:
    """``params`` (default: the fit's) as one row in the law's parameter order."""
    values = params or fitted.params
    return np.array([[values[n] for n in fitted.law.param_names]], dtype=float)


def _sample_rows(moe: FittedLaw, up: FittedLaw) -> tuple[np.ndarray, np.ndarray]:
    """The bootstrap pairs (sample i of each fit, as many as the shorter side has; none without samples on both)."""
    ms, us = (np.empty((0, len(f.law.params))) if f.samples is None else np.asarray(f.samples, float)
              for f in (moe, up))
    n = min(len(ms), len(us))
    return ms[:n], us[:n]


@dataclass(frozen=True)
class Crossings:
    """Every crossing in TOKEN_RANGE and which side wins on each interval between them."""

    n1: float
    crossings: tuple[float, ...]
    segments: tuple[tuple[float, float, str], ...]  # (from, to, "upcycle" | "scratch")

    @property
    def dstar(self) -> float:
        """The first token count where upcycling stops winning; inf if it always wins, 0 if it never does."""
        for lo, _, side in self.segments:
            if side == "scratch":
                return lo if lo > TOKEN_RANGE[0] else 0.0
        return float("inf")


class _Path:
    """L_MoE(N1, D) and L_upcycled(D1 = D, D2 = D, N1) at one N1 (Eq. 13); parameter row r of both is one pair."""

    def __init__(self, moe: FittedLaw, up: FittedLaw, n1: float, moe_rows: np.ndarray, up_rows: np.ndarray) -> None:
        self.n1 = n1
        self.moe = _Curve(moe.law, "N", n1, moe_rows)
        self.up = _Curve(up.law, "N1", n1, up_rows)

    def gap(self, log_d: np.ndarray, row: int) -> np.ndarray:
        d = np.exp(log_d)
        return self.moe.loss(self.moe.design({"D": d}), row) - self.up.loss(self.up.design({"D1": d, "D2": d}), row)

    def crossings(self) -> list[Crossings]:
        """The crossings of every row: the gap on the log grid for all rows at once (one design per law, one
        product per block of rows), then brentq on each sign change of each row."""
        x = np.linspace(*np.log(TOKEN_RANGE), _GRID)
        d = np.exp(x)
        X_moe, X_up = self.moe.design({"D": d}), self.up.design({"D1": d, "D2": d})
        out = []
        for start in range(0, len(self.moe.theta), _ROWS):
            block = slice(start, start + _ROWS)
            g = self.moe.losses(X_moe, block) - self.up.losses(X_up, block)  # (grid, rows)
            change = np.sign(g[:-1]) * np.sign(g[1:]) < 0
            out.extend(self._row_crossings(start + r, x, np.flatnonzero(change[:, r])) for r in range(g.shape[1]))
        return out

    def _row_crossings(self, row: int, x: np.ndarray, brackets: np.ndarray) -> Crossings:
        roots = [float(np.exp(brentq(lambda v: self.gap(np.array([v]), row)[0], x[i], x[i + 1], xtol=1e-12)))
                 for i in brackets]
        edges = [TOKEN_RANGE[0], *roots, TOKEN_RANGE[1]]
        segments = []
        for lo, hi in itertools.pairwise(edges):
            mid = np.sqrt(lo * hi)
            segments.append((lo, hi, "upcycle" if self.gap(np.log([mid]), row)[0] > 0 else "scratch"))
        return Crossings(self.n1, tuple(roots), tuple(segments))


def crossings(moe: FittedLaw, up: FittedLaw, n1: float, moe_params: dict[str, float] | None = None,
              up_params: dict[str, float] | None = None) -> Crossings:
    """Roots of L_MoE(N1, D) − L_upcycled(D, D, N1) over TOKEN_RANGE."""
    return _Path(moe, up, n1, _fit_row(moe, moe_params), _fit_row(up, up_params)).crossings()[0]


def dstar_samples(moe: FittedLaw, up: FittedLaw, n1: float) -> np.ndarray:
    """D* for every bootstrap pair (sample i of each fit); empty without samples on both sides."""
    return np.array([c.dstar for c in _Path(moe, up, n1, *_sample_rows(moe, up)).crossings()])


def crossings_and_samples(moe: FittedLaw, up: FittedLaw, n1: float) -> tuple[Crossings, np.ndarray]:
    """``crossings`` of the fits and ``dstar_samples``, from one design per law at this N1."""
    ms, us = _sample_rows(moe, up)
    first, *rest = _Path(moe, up, n1, np.vstack([_fit_row(moe), ms]), np.vstack([_fit_row(up), us])).crossings()
    return first, np.array([c.dstar for c in rest])


def fit_closed_form(n1: np.ndarray, dstar: np.ndarray) -> dict[str, float]:
    """a, b, c of D* ≈ a·(N1/1e9)^(b + c·log(N1/1e9)) (the paper's Eq. 2) by least squares on log D*."""
    n1, dstar = np.asarray(n1, float), np.asarray(dstar, float)
    ok = np.isfinite(dstar) & (dstar > 0)
    if ok.sum() < 3:
        raise FitError(f"D* is finite at only {int(ok.sum())} model size(s); the closed form needs 3")
    x = np.log(n1[ok] / 1e9)
    coef, *_ = np.linalg.lstsq(np.column_stack([np.ones_like(x), x, x * x]), np.log(dstar[ok]), rcond=None)
    return {"a": float(np.exp(coef[0])), "b": float(coef[1]), "c": float(coef[2])}


def closed_form_dstar(cf: dict[str, float], n1: np.ndarray) -> np.ndarray:
    x = np.log(np.asarray(n1, float) / 1e9)
    return cf["a"] * np.exp(x * (cf["b"] + cf["c"] * x))


def dstar_at(moe: FittedLaw, up: FittedLaw, n1: float) -> dict[str, Any]:
    """One N1's entry of the `upscale dstar` JSON: the crossings, D*, its bootstrap interval (null without samples)
    and who wins where. The decision endpoint and the refits need only this, not the closed form."""
    check_pair(moe, up)
    if not (math.isfinite(n1) and n1 > 0):
        raise FitError(f"--n1 must be a positive parameter count, got {n1}")
    c, samples = crossings_and_samples(moe, up, n1)
    return {"n1": n1, "crossings": list(c.crossings), "dstar": c.dstar,
            "ci": list(percentile_interval(samples)) if samples.size else None,
            "segments": [{"from": lo, "to": hi, "wins": side} for lo, hi, side in c.segments]}


def dstar_results(moe: FittedLaw, up: FittedLaw, n1s: list[float],
                  n1_range: tuple[float, float] = N1_RANGE) -> dict[str, Any]:
    """The `upscale dstar` JSON for fitted laws (the CLI and the demo): ``dstar_at`` for every N1 of ``n1s`` and
    the closed form, fitted over ``n1_range`` and null where fewer than 3 sizes there have a finite D* (upcycling
    always, or never, wins)."""
    check_pair(moe, up)
    results = [dstar_at(moe, up, n1) for n1 in n1s]
    grid = np.geomspace(*n1_range, 16)
    try:
        closed = fit_closed_form(grid, np.array([crossings(moe, up, n).dstar for n in grid]))
    except FitError:
        closed = None
    return {"results": results, "closed_form": closed}


def _upcycled_tokens(d1: float | np.ndarray, d2: float | np.ndarray) -> dict[str, np.ndarray]:
    d1, d2 = np.broadcast_arrays(np.atleast_1d(np.asarray(d1, float)), np.atleast_1d(np.asarray(d2, float)))
    return {"D1": d1, "D2": d2}


def _catch_up(moe: _Curve, row: int, target: float) -> float:
    """Tokens where the MoE law of parameter row ``row`` reaches the loss ``target`` (see ``catch_up``)."""

    def f(log_d: float) -> float:
        return moe.loss(moe.design({"D": np.atleast_1d(np.exp(log_d))}), row)[0] - target

    lo, hi = np.log(1.0), np.log(TOKEN_RANGE[1] * 1e4)
    if f(hi) > 0:
        return float("inf")
    if f(lo) < 0:
        return 0.0
    return float(np.exp(brentq(f, lo, hi, xtol=1e-12)))


def catch_up(moe: FittedLaw, up: FittedLaw, n1: float, d1: float, d2: float,
             moe_params: dict[str, float] | None = None, up_params: dict[str, float] | None = None) -> float:
    """Tokens D_MoE with L_MoE(N1, D_MoE) = L_upcycled(D1, D2, N1); inf when from scratch never gets there."""
    upcycled = _Curve(up.law, "N1", n1, _fit_row(up, up_params))
    target = upcycled.loss(upcycled.design(_upcycled_tokens(d1, d2)), 0)[0]
    return _catch_up(_Curve(moe.law, "N", n1, _fit_row(moe, moe_params)), 0, target)


@dataclass(frozen=True)
class UpcycleDecision:
    """A verdict for one (N1, D1, D2): the catch-up budget and, with bootstrap samples, its probability."""

    n1: float
    d1: float
    d2: float
    loss_upcycled: float
    catch_up_tokens: float
    verdict: str  # "upcycle" when D_MoE > D1, else "scratch"
    probability_upcycle: float | None  # share of bootstrap pairs with the verdict "upcycle"
    catch_up_ci: tuple[float, float] | None

    def to_json(self) -> dict:
        return {"n1": self.n1, "d1": self.d1, "d2": self.d2, "loss_upcycled": self.loss_upcycled,
                "catch_up_tokens": finite_or_none(self.catch_up_tokens),
                "tokens_saved": finite_or_none(self.catch_up_tokens - self.d2),
                "verdict": self.verdict, "probability_upcycle": self.probability_upcycle,
                "catch_up_ci": [finite_or_none(v) for v in self.catch_up_ci] if self.catch_up_ci else None}


def decide(moe: FittedLaw, up: FittedLaw, n1: float, d1: float, d2: float) -> UpcycleDecision:
    """Upcycle or train from scratch, for a dense model of N1 parameters trained on D1 tokens and D2 to spend."""
    check_pair(moe, up)
    for name, v in (("--n1", n1), ("--d1", d1), ("--d2", d2)):
        if not (np.isfinite(v) and v > 0):
            raise FitError(f"{name} must be a positive number, got {v}")
    ms, us = _sample_rows(moe, up)
    scratch = _Curve(moe.law, "N", n1, np.vstack([_fit_row(moe), ms]))  # row 0 the fits, then the bootstrap pairs
    upcycled = _Curve(up.law, "N1", n1, np.vstack([_fit_row(up), us]))
    X = upcycled.design(_upcycled_tokens(d1, d2))
    # one product per row (not one for all): the targets, and so the budgets, are catch_up's to the bit
    budgets = [_catch_up(scratch, r, upcycled.loss(X, r)[0]) for r in range(len(upcycled.theta))]
    d_moe = budgets[0]
    prob, ci = None, None
    if len(budgets) > 1:
        samples = np.array(budgets[1:])
        prob = float(np.mean(samples > d1))
        ci = percentile_interval(samples)
    verdict = "upcycle" if d_moe > d1 else "scratch"
    return UpcycleDecision(n1, d1, d2, float(upcycled.loss(X, 0)[0]), d_moe, verdict, prob, ci)
