"""D*, the catch-up budget and the verdict: where training the MoE from scratch overtakes upcycling.

D* (Eq. 13) solves L_MoE(N1, D) = L_upcycled(D1 = D, D2 = D, N1): the MoE law is fitted on (D, N) with N = N1
(as the paper's Table 2), the upcycled law on (D1, D2, N1). The gap L_MoE − L_upcycled is scanned on a log grid
and every sign change is refined with brentq, because the laws can cross twice (with the paper's Table 2
parameters at N1 = 1e9: ~3e9 and ~5e11 tokens). D* is the first crossing where upcycling stops winning.

Catch-up budget: for a user's (N1, D1, D2), the D_MoE at which from-scratch training reaches the upcycled loss.
The verdict follows the paper (Fig. 15, Sec. 5.1): upcycling is efficient when D_MoE exceeds the sunk cost D1.
``dstar_results`` is the `upscale dstar` JSON (D* and its interval per N1, the closed form D*(N1)).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import brentq

from fitting.bootstrap import percentile_interval
from fitting.errors import FitError
from fitting.summary import FittedLaw, finite_or_none

TOKEN_RANGE = (1e6, 1e16)  # where crossings are searched: far beyond any training run at both ends
N1_RANGE = (1e8, 1e11)  # model sizes over which the closed form D*(N1) is fitted (the paper's Fig. 1 span)
_GRID = 400


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


def crossings(moe: FittedLaw, up: FittedLaw, n1: float, moe_params: dict[str, float] | None = None,
              up_params: dict[str, float] | None = None) -> Crossings:
    """Roots of L_MoE(N1, D) − L_upcycled(D, D, N1) over TOKEN_RANGE."""

    def gap(log_d: np.ndarray) -> np.ndarray:
        d = np.exp(log_d)
        return moe_loss(moe, n1, d, moe_params) - upcycled_loss(up, n1, d, d, up_params)

    x = np.linspace(*np.log(TOKEN_RANGE), _GRID)
    g = gap(x)
    roots = []
    for i in np.flatnonzero(np.sign(g[:-1]) * np.sign(g[1:]) < 0):
        roots.append(float(np.exp(brentq(lambda v: gap(np.array([v]))[0], x[i], x[i + 1], xtol=1e-12))))
    edges = [TOKEN_RANGE[0], *roots, TOKEN_RANGE[1]]
    segments = []
    for lo, hi in itertools.pairwise(edges):
        mid = np.sqrt(lo * hi)
        segments.append((lo, hi, "upcycle" if gap(np.log([mid]))[0] > 0 else "scratch"))
    return Crossings(n1, tuple(roots), tuple(segments))


def dstar_samples(moe: FittedLaw, up: FittedLaw, n1: float) -> np.ndarray:
    """D* for every bootstrap pair (sample i of each fit); empty without samples on both sides."""
    ms, us = moe.sample_params(), up.sample_params()
    return np.array([crossings(moe, up, n1, m, u).dstar for m, u in zip(ms, us, strict=False)])


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


def dstar_results(moe: FittedLaw, up: FittedLaw, n1s: list[float],
                  n1_range: tuple[float, float] = N1_RANGE) -> dict[str, Any]:
    """The `upscale dstar` JSON for fitted laws (the CLI, the demo and the API); the closed form is fitted over
    ``n1_range`` and is null where fewer than 3 sizes there have a finite D* (upcycling always, or never, wins)."""
    check_pair(moe, up)
    results = []
    for n1 in n1s:
        if not (math.isfinite(n1) and n1 > 0):
            raise FitError(f"--n1 must be a positive parameter count, got {n1}")
        c = crossings(moe, up, n1)
        samples = dstar_samples(moe, up, n1)
        results.append({"n1": n1, "crossings": list(c.crossings), "dstar": c.dstar,
                        "ci": list(percentile_interval(samples)) if samples.size else None,
                        "segments": [{"from": lo, "to": hi, "wins": side} for lo, hi, side in c.segments]})
    grid = np.geomspace(*n1_range, 16)
    try:
        closed = fit_closed_form(grid, np.array([crossings(moe, up, n).dstar for n in grid]))
    except FitError:
        closed = None
    return {"results": results, "closed_form": closed}


def catch_up(moe: FittedLaw, up: FittedLaw, n1: float, d1: float, d2: float,
             moe_params: dict[str, float] | None = None, up_params: dict[str, float] | None = None) -> float:
    """Tokens D_MoE with L_MoE(N1, D_MoE) = L_upcycled(D1, D2, N1); inf when from scratch never gets there."""
    target = upcycled_loss(up, n1, d1, d2, up_params)[0]

    def f(log_d: float) -> float:
        return moe_loss(moe, n1, np.exp(log_d), moe_params)[0] - target

    lo, hi = np.log(1.0), np.log(TOKEN_RANGE[1] * 1e4)
    if f(hi) > 0:
        return float("inf")
    if f(lo) < 0:
        return 0.0
    return float(np.exp(brentq(f, lo, hi, xtol=1e-12)))


@dataclass(frozen=True)
class Decision:
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


def decide(moe: FittedLaw, up: FittedLaw, n1: float, d1: float, d2: float) -> Decision:
    """Upcycle or train from scratch, for a dense model of N1 parameters trained on D1 tokens and D2 to spend."""
    check_pair(moe, up)
    for name, v in (("--n1", n1), ("--d1", d1), ("--d2", d2)):
        if not (np.isfinite(v) and v > 0):
            raise FitError(f"{name} must be a positive number, got {v}")
    d_moe = catch_up(moe, up, n1, d1, d2)
    prob, ci = None, None
    pairs = list(zip(moe.sample_params(), up.sample_params(), strict=False))
    if pairs:
        budgets = np.array([catch_up(moe, up, n1, d1, d2, m, u) for m, u in pairs])
        prob = float(np.mean(budgets > d1))
        ci = percentile_interval(budgets)
    return Decision(n1, d1, d2, float(upcycled_loss(up, n1, d1, d2)[0]), d_moe,
                    "upcycle" if d_moe > d1 else "scratch", prob, ci)
