"""The profile-likelihood interval of D*: every D* the data do not reject, found by refitting both laws with their
crossing forced there (docs/laws.md, "The profile interval of D*").

The delta method (fitting/design.py) reads D*'s spread off the fit's own geometry: how steeply the two fitted curves
cross. That angle is itself an estimate, and where a fit makes the curves cross more steeply than the truth does, the
standard deviation shrinks with the very error it should measure. Inverting the likelihood-ratio test does not lean
on it: a candidate ℓ = log D is inside the interval when the best fit that crosses at ℓ is not much worse than the
best fit overall, ΔQ(ℓ) ≤ q² with q the Student-t quantile of the delta interval (F(1, dof) = t²). The interval
follows the skew of D*'s distribution, does not depend on how the laws are parametrised, and is one-sided when the
data bound D* from one side only (D* = 0 or ∞: beyond the tokens searched).

Q is the generalised least-squares objective of log loss under the per-trunk noise model (σ²I + τ²11ᵀ per trunk):
each trunk's residuals are whitened, r ↦ (r − a·mean(r))/σ with a = 1 − σ/√(σ² + nτ²), so that a trunk's shared
draw counts once (rows predicted from a curve add their own variance to σ² and are whitened by the block's inverse
Cholesky factor). A constrained fit is SLSQP with log L_MoE(ℓ) = log L_up(ℓ) as its equality, started from the
neighbouring ℓ's solution: the walk outwards from D̂* is a continuation.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq, least_squares, minimize

from upscale.fitting.design import Noise, log_loss_jacobian
from upscale.fitting.dstar import TOKEN_RANGE, crossings
from upscale.fitting.laws import Law, Table
from upscale.fitting.summary import FittedLaw

FIRST_STEP = 0.1  # of log D, the walk's first step away from D̂*; each next one is STEP_GROWTH times longer
STEP_GROWTH = 1.5
SCAN_STEP = 1.0  # of log D, between the constrained fits that look for D* where the free fit's laws do not cross
RESTARTS = 3  # times the walk starts again when a constrained fit finds a better optimum than the free fit
CONSTRAINT_TOL = 1e-5  # |log L_MoE − log L_up| a constrained fit must reach to count (noise is ~5e-3)


@dataclass(frozen=True)
class Observed:
    """One law's observations as the profile refits them: the fit to start from (user units, the fixed parameters
    included), which parameters are free, the rows, their losses and the trunk of each."""

    law: Law
    params: Mapping[str, float]
    free: tuple[str, ...]
    table: Table
    loss: np.ndarray
    trunks: tuple[Hashable, ...]
    extra: np.ndarray | None = None  # per row, variance of log loss beyond the point noise (a predicted row's)


@dataclass(frozen=True)
class ProfileInterval:
    """D*'s profile-likelihood interval at ``level``: ``lo`` is 0 and ``hi`` inf where the data do not bound that
    side within the tokens searched; (span end, inf) or (0, span start) when a crossing is rejected everywhere in the
    span and the fit's laws part towards that end (D* beyond the tokens searched); both NaN when no crossing is
    consistent with the data at all. ``dstar`` is the generalised least-squares fit's D*."""

    lo: float
    hi: float
    dstar: float
    level: float
    fits: int  # constrained fits the walk ran

    def covers(self, dstar: float) -> bool:
        return bool(self.lo <= dstar <= self.hi)

    def ends(self) -> list[float | None] | None:
        """[lo, hi] as the API reports them: an open end (0 or inf) is None; None when no crossing is consistent with
        the data (an interval open at both ends is [None, None]: every D* searched is)."""
        if math.isnan(self.lo):
            return None
        return [self.lo if self.lo > 0 else None, self.hi if math.isfinite(self.hi) else None]


def _whitener(trunks: tuple[Hashable, ...], noise: Noise, extra: np.ndarray | None = None) -> np.ndarray:
    """(σ²I + τ²11ᵀ)^(−1/2) per trunk, as one block matrix over the rows; with ``extra`` (predicted rows' variance
    beyond σ², fitting/design.py's Rows) the inverse Cholesky factor of diag(σ² + extra) + τ²11ᵀ instead."""
    n = len(trunks)
    W = np.eye(n) / noise.point_sd
    groups: dict[Hashable, list[int]] = {}
    for i, t in enumerate(trunks):
        groups.setdefault(t, []).append(i)
    s2, t2 = noise.point_sd ** 2, noise.trunk_sd ** 2
    for idx in groups.values():
        k = len(idx)
        if extra is not None and np.any(extra[idx] > 0):
            cov = np.diag(s2 + extra[idx]) + t2
            W[np.ix_(idx, idx)] = np.linalg.inv(np.linalg.cholesky(cov))
            continue
        a = 1.0 - math.sqrt(s2 / (s2 + k * t2))
        W[np.ix_(idx, idx)] -= a / k / noise.point_sd
    return W


class _Problem:
    """Q(θ) over both laws' free parameters (fitted coordinates) and the crossing constraint at a given ℓ."""

    def __init__(self, moe: Observed, up: Observed, n1: float, noise: Noise) -> None:
        self.parts = (moe, up)
        self.n1 = n1
        self.sizes = [len(o.free) for o in self.parts]
        self.whiten = [_whitener(o.trunks, noise, o.extra) for o in self.parts]
        self.log_loss = [np.log(np.asarray(o.loss, float)) for o in self.parts]
        self.theta0 = np.concatenate([[o.law.param(n).to_fitted(o.params[n]) for n in o.free] for o in self.parts])
        with np.errstate(all="ignore"):
            norms = np.linalg.norm(self.residuals(self.theta0)[1], axis=0)
        self.scale = np.where(np.isfinite(norms) & (norms > 0), 1.0 / np.where(norms > 0, norms, 1.0), 1.0)

    def params(self, theta: np.ndarray) -> list[dict[str, float]]:
        out, start = [], 0
        for o, size in zip(self.parts, self.sizes, strict=True):
            p = dict(o.params)
            for n, v in zip(o.free, theta[start:start + size], strict=True):
                p[n] = o.law.param(n).to_user(float(v))
            out.append(p)
            start += size
        return out

    def residuals(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Whitened log residuals and their Jacobian (block diagonal: the laws share no parameter)."""
        rs, blocks = [], []
        for o, W, y, p in zip(self.parts, self.whiten, self.log_loss, self.params(theta), strict=True):
            pred, J = log_loss_jacobian(o.law, p, o.table, o.free)
            rs.append(W @ (np.log(pred) - y))
            blocks.append(W @ J)
        jac = np.zeros((sum(len(r) for r in rs), len(theta)))
        row, col = 0, 0
        for b in blocks:
            jac[row:row + b.shape[0], col:col + b.shape[1]] = b
            row, col = row + b.shape[0], col + b.shape[1]
        return np.concatenate(rs), jac

    def objective(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        with np.errstate(all="ignore"):
            r, J = self.residuals(theta)
        if not np.all(np.isfinite(r)):
            return 1e300, np.zeros_like(theta)
        return float(r @ r), 2 * J.T @ r

    def gap(self, theta: np.ndarray, ell: float) -> tuple[float, np.ndarray]:
        """log L_MoE − log L_up at D = D1 = D2 = e^ℓ, N1, and its gradient."""
        moe, up = self.params(theta)
        d, n = np.array([math.exp(ell)]), np.full(1, self.n1)
        lm, jm = log_loss_jacobian(self.parts[0].law, moe, {"D": d, "N": n}, self.parts[0].free)
        lu, ju = log_loss_jacobian(self.parts[1].law, up, {"D1": d, "D2": d, "N1": n}, self.parts[1].free)
        return float(np.log(lm[0]) - np.log(lu[0])), np.concatenate([jm[0], -ju[0]])

    def fit(self, theta: np.ndarray) -> tuple[np.ndarray, float]:
        """The free (unconstrained) generalised least-squares fit from ``theta``."""
        with np.errstate(all="ignore"):
            r = least_squares(lambda t: self.residuals(t)[0], theta, jac=lambda t: self.residuals(t)[1],
                              x_scale="jac", max_nfev=400)
        return r.x, float(r.fun @ r.fun)

    def fit_crossing(self, theta: np.ndarray, ell: float) -> tuple[np.ndarray, float]:
        """The best fit whose laws cross at ℓ (Q = inf when SLSQP cannot meet the crossing from ``theta``). SLSQP
        runs on θ / ``scale``: log scales near 10 and an interaction exponent near 1e-3 are otherwise too far apart
        for its quasi-Newton steps."""
        s = self.scale

        def objective(z: np.ndarray) -> tuple[float, np.ndarray]:
            q, g = self.objective(z * s)
            return q, g * s

        def gap(z: np.ndarray) -> float:
            return self.gap(z * s, ell)[0]

        with np.errstate(all="ignore"):
            r = minimize(objective, theta / s, jac=True, method="SLSQP",
                         constraints=[{"type": "eq", "fun": gap, "jac": lambda z: self.gap(z * s, ell)[1] * s}],
                         options={"maxiter": 300, "ftol": 1e-10})
            x = r.x * s
            if not np.all(np.isfinite(x)) or not abs(self.gap(x, ell)[0]) <= CONSTRAINT_TOL:
                return theta, math.inf
        return x, float(self.objective(x)[0])

    def dstar(self, theta: np.ndarray) -> float:
        moe, up = self.params(theta)
        return crossings(FittedLaw(self.parts[0].law, moe), FittedLaw(self.parts[1].law, up), self.n1).dstar


class _BetterOptimum(Exception):
    """A constrained fit beat the free one: the free fit was a local optimum; start again from there."""

    def __init__(self, theta: np.ndarray) -> None:
        self.theta = theta


class _Walk:
    """ΔQ along ℓ with continuation; raises _BetterOptimum when a crossing fit undercuts the free fit."""

    def __init__(self, problem: _Problem, theta: np.ndarray, q_min: float, threshold: float) -> None:
        self.problem, self.q_min, self.threshold = problem, q_min, threshold
        self.theta_hat = theta
        self.fits = 0

    def excess(self, ell: float, start: np.ndarray) -> tuple[float, np.ndarray]:
        """ΔQ(ℓ) − q², and the constrained solution (the next start). From ``start`` (the neighbour's solution), and
        from the free fit when that fails or does worse."""
        theta, q = self.problem.fit_crossing(start, ell)
        self.fits += 1
        if start is not self.theta_hat and (not math.isfinite(q) or q - self.q_min > self.threshold):
            again, q_again = self.problem.fit_crossing(self.theta_hat, ell)
            self.fits += 1
            if q_again < q:
                theta, q = again, q_again
        if q < self.q_min - 1e-9 * max(1.0, self.q_min):
            raise _BetterOptimum(theta)
        return q - self.q_min - self.threshold, theta

    def scan(self, limits: tuple[float, float]) -> tuple[float, np.ndarray, float]:
        """ΔQ − q² at most every SCAN_STEP of ℓ across ``limits``, both ends included (a continuation from the low
        end): the least one, its ℓ and its solution. Where the free fit has no crossing, ΔQ need not fall
        monotonically towards either end."""
        best = (math.inf, self.theta_hat, math.inf)
        theta = self.theta_hat
        for ell in np.linspace(*limits, math.ceil((limits[1] - limits[0]) / SCAN_STEP) + 1):
            excess, solved = self.excess(float(ell), theta)
            if math.isfinite(excess):
                theta = solved
                if excess < best[2]:
                    best = (float(ell), solved, excess)
        return best

    def bisect(self, inside: float, outside: float, theta: np.ndarray) -> float:
        """The ℓ between ``inside`` and ``outside`` where ΔQ = q², each refit started from ``inside``'s solution.
        The walk already found ``inside`` inside; where the refit there fails (SLSQP does not meet the crossing
        again from this start), the edge is ``inside``: the narrower end, since nothing beyond it was shown inside."""
        seen: dict[float, float] = {}

        def excess(v: float) -> float:  # brentq asks for ``inside`` again: its refit runs once
            if v not in seen:
                seen[v] = self.excess(v, theta)[0]
            return seen[v]

        if not excess(inside) < 0:
            return inside
        return brentq(excess, *sorted((inside, outside)), xtol=1e-3)

    def edge(self, ell0: float, theta0: np.ndarray, direction: int, limit: float) -> float:
        """The ℓ beyond ``ell0`` (inside) in ``direction`` where ΔQ reaches q², or ±inf past ``limit``."""
        ell, theta, step = ell0, theta0, FIRST_STEP
        while True:
            nxt = ell + direction * step
            past = (nxt - limit) * direction >= 0
            if past:
                nxt = limit
            ex, theta_next = self.excess(nxt, theta)
            if ex > 0:
                return self.bisect(ell, nxt, theta)
            if past:
                return direction * math.inf
            ell, theta, step = nxt, theta_next, step * STEP_GROWTH


def profile_interval(moe: Observed, up: Observed, n1: float, noise: Noise, quantile: float, level: float,
                     span: tuple[float, float] = TOKEN_RANGE) -> ProfileInterval:
    """D*'s interval at ``level``: the ℓ = log D in ``span`` with ΔQ(ℓ) ≤ ``quantile``² (the caller's t quantile
    for ``level``), walked outwards from the fit's D* (from the least ΔQ of a scan across ``span`` when its laws do
    not cross inside it)."""
    problem = _Problem(moe, up, n1, noise)
    limits = (math.log(span[0]), math.log(span[1]))
    theta = problem.theta0
    fits = 0
    for _ in range(RESTARTS + 1):
        theta_hat, q_min = problem.fit(theta)
        dstar = problem.dstar(theta_hat)
        walk = _Walk(problem, theta_hat, q_min, quantile ** 2)
        try:
            if math.isfinite(dstar) and dstar > 0:
                ell = math.log(dstar)
                lo = walk.edge(ell, theta_hat, -1, limits[0])
                hi = walk.edge(ell, theta_hat, +1, limits[1])
            else:  # no crossing in span: the walk starts from the scan's least ΔQ
                ell, theta_start, excess = walk.scan(limits)
                if excess > 0:  # a crossing is rejected everywhere: beyond the span where the fit points, or none
                    lo, hi = ((span[1], math.inf) if dstar > 0 and ell == limits[1] else
                              (0.0, span[0]) if dstar == 0 and ell == limits[0] else (math.nan, math.nan))
                    return ProfileInterval(lo, hi, dstar, level, fits + walk.fits)
                lo = walk.edge(ell, theta_start, -1, limits[0])
                hi = walk.edge(ell, theta_start, +1, limits[1])
        except _BetterOptimum as better:
            theta, fits = better.theta, fits + walk.fits
            continue
        return ProfileInterval(math.exp(lo), math.exp(hi), dstar, level, fits + walk.fits)
    return ProfileInterval(math.nan, math.nan, dstar, level, fits + walk.fits)
