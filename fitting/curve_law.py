"""The multi-power law of a loss curve under any learning-rate schedule (docs/laws.md, "Loss-curve laws").

A WSD trunk's curve at constant LR and its decay branches are one law apart (Luo et al., ICLR 2025):

    L(t) = L0 + A·(S1(t) + S_W)^−alpha − LD(t),   S1(t) + S_W = Σ_{τ≤t} η_τ (the LR area, warmup included),
    LD(t) = B · Σ_{k after the peak, k≤t} (η_{k−1} − η_k) · G(η_k^−gamma · S_k(t)),   S_k(t) = Σ_{τ=k..t} η_τ,
    G(x) = 1 − (C·x + 1)^−beta.

At constant LR, LD = 0 and the law is a power law in the area; every LR drop adds a loss reduction that grows
with the area trained after it. The curve laws of fitting/laws.py are sums of power laws in table columns; this one
reads whole schedules, so it has its own numerics, fitted the way the fitter fits the others (summed Huber(δ=1e-3) of
log L̂ − log L, exact gradient, runs from the best points of a screened start grid whose scales L0, A, B are solved
by linear least squares, best converged run or FitError); the optimiser is L-BFGS-B, holding the exponents in their
boxes (``_Problem.minimize`` says why). LRs are rescaled by the largest one given (areas in steps
at the peak LR) so that one start grid serves every LR; parameters are reported in the units the LRs were given in.

The decay parameters (B, C, beta, gamma) are identified only by curves that decay: a fit on constant-LR curves alone
needs them fixed (e.g. from a fit of another model size's decays), and then predicts any decay from the trunk curve.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize

from upscale.fitting.errors import FitError
from upscale.fitting.fit import FITTER_VERSION, FitOptions, FitProvenance, FitResult, StartResult, best_start
from upscale.fitting.laws import Param

DECAY_PARAMS = ("B", "C", "beta", "gamma")
# A decay to LR 0 reaches η_k^−gamma = ∞ (G at its limit, 1); it counts as this fraction of the peak LR instead
ZERO_LR = 1e-8


@dataclass(frozen=True)
class CurveLaw:
    """A law of the loss along a run: its parameters (in fitted order) and where it comes from."""

    name: str
    source: str
    formula: str
    params: tuple[Param, ...]

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)


MULTI_POWER = CurveLaw(
    "multi-power", "Luo et al., ICLR 2025 (arXiv 2503.12811)",
    "L(t) = L0 + A·(S1(t)+S_W)^−alpha − B·Σ_k (η_{k−1}−η_k)·(1 − (C·η_k^−gamma·S_k(t) + 1)^−beta)",
    (Param("L0", "scale", (1e-3, 20.0), ()), Param("A", "scale", (1e-6, 1e8), ()),
     Param("alpha", "exponent", (0.0, 3.0), (0.2, 0.4, 0.7)), Param("B", "scale", (1e-6, 1e8), ()),
     # C's starts are multiples of 1/(a decay's LR area) (``_c_starts``), so they hold for any decay length
     Param("C", "scale", (1e-8, 1e8), (0.3, 3.0, 30.0)),
     Param("beta", "exponent", (0.05, 5.0), (0.3, 0.6, 1.2)), Param("gamma", "exponent", (0.0, 3.0), (0.3, 0.6, 1.0))),
)
CURVE_LAWS = {MULTI_POWER.name: MULTI_POWER}


@dataclass(frozen=True)
class Curve:
    """One run: the LR of every optimiser step 1..T (``lr[0]`` is step 1's) and the loss measured after some of
    them (``steps``: how many steps were done, 1..T)."""

    lr: np.ndarray
    steps: np.ndarray
    loss: np.ndarray | None = None  # None for a curve only predicted

    def __post_init__(self) -> None:
        lr = np.asarray(self.lr, dtype=float)
        steps = np.asarray(self.steps)
        if lr.ndim != 1 or not lr.size or not np.all(np.isfinite(lr)) or np.any(lr < 0) or not lr.max() > 0:
            raise FitError("the learning-rate schedule must be a non-empty 1-d array of finite LRs >= 0, not all 0: "
                           "pass one LR per optimiser step")
        if steps.ndim != 1 or not steps.size or not np.all(np.isfinite(steps)) or np.any(steps != np.round(steps)):
            raise FitError("steps must be a non-empty 1-d array of whole step counts (after how many steps each "
                           "loss was measured)")
        if steps.min() < 1 or steps.max() > lr.size:
            raise FitError(f"steps run from {steps.min():g} to {steps.max():g} but the schedule has {lr.size} LRs: "
                           f"give the LR of every step up to the last measured one (steps count from 1)")
        object.__setattr__(self, "lr", lr)
        object.__setattr__(self, "steps", steps.astype(int))
        if self.loss is not None:
            loss = np.asarray(self.loss, dtype=float)
            if loss.shape != steps.shape:
                raise FitError(f"{loss.size} losses for {steps.size} steps: give one loss per measured step")
            if not np.all(np.isfinite(loss)) or np.any(loss <= 0):
                bad = np.flatnonzero(~np.isfinite(loss) | (loss <= 0))
                raise FitError(f"losses must be finite and positive; entries {bad[:10].tolist()} are not "
                               f"(drop those measurements)")
            object.__setattr__(self, "loss", loss)


@dataclass(frozen=True)
class _Decays:
    """One curve's LR changes after its peak, against its measurements: only these enter LD."""

    rows: np.ndarray  # (r,) which measurements (of all curves') are at or after the first change
    drop: np.ndarray  # (r, m) η_{k−1} − η_k of every change k, 0 where k is after the measurement
    after: np.ndarray  # (r, m) S_k(t)
    log_lr: np.ndarray  # (m,) log η_k


@dataclass(frozen=True)
class _Terms:
    """What the law needs of a set of curves, parameters aside (LRs rescaled by ``scale``)."""

    area: np.ndarray  # (n,) S1(t) + S_W at each measurement
    decays: tuple[_Decays, ...]
    decay_area: float  # median LR area of a decay (what C's starts are relative to); 0 if nothing decays


def _terms(curves: list[Curve], scale: float) -> _Terms:
    areas, decays, decay_areas = [], [], []
    first = 0
    for c in curves:
        lr = c.lr / scale
        cum = np.concatenate([[0.0], np.cumsum(lr)])  # cum[t] = Σ_{τ≤t} η_τ
        peak = int(np.argmax(lr))
        delta = np.concatenate([[0.0], lr[:-1] - lr[1:]])  # delta[k−1] = η_{k−1} − η_k for step k
        ks = np.flatnonzero(delta[peak + 1:]) + peak + 1  # 0-based steps after the peak where the LR changes
        areas.append(cum[c.steps])
        if ks.size:
            seen = np.flatnonzero(c.steps >= ks[0] + 1)
            t = c.steps[seen][:, None]
            live = (ks[None, :] + 1) <= t
            decays.append(_Decays(first + seen, np.where(live, delta[ks][None, :], 0.0),
                                  np.where(live, cum[t] - cum[ks][None, :], 0.0),
                                  np.log(np.maximum(lr[ks], ZERO_LR))))
            decay_areas.append(cum[-1] - cum[ks[0]])
        first += c.steps.size
    return _Terms(np.concatenate(areas), tuple(decays), float(np.median(decay_areas)) if decay_areas else 0.0)


def _user_params(unit: dict[str, float], scale: float) -> dict[str, float]:
    """Parameters for LRs divided by ``scale`` -> for LRs in user units (η = scale·η̃)."""
    p = dict(unit)
    p["A"] = unit["A"] * scale ** unit["alpha"]
    p["B"] = unit["B"] / scale
    p["C"] = unit["C"] * scale ** (unit["gamma"] - 1.0)
    return p


def _fixed_unit(fixed: dict[str, float], scale: float) -> dict[str, float]:
    """Fixed parameters (user units) for LRs divided by ``scale``: A's units depend on alpha, C's on gamma."""
    for k, e in (("A", "alpha"), ("C", "gamma")):
        if k in fixed and e not in fixed:
            raise FitError(f"fixing {k} needs {e} fixed too (the units of {k} depend on it)")
    out = dict(fixed)
    if "A" in fixed:
        out["A"] = fixed["A"] * scale ** -fixed["alpha"]
    if "B" in fixed:
        out["B"] = fixed["B"] * scale
    if "C" in fixed:
        out["C"] = fixed["C"] * scale ** (1.0 - fixed["gamma"])
    return out


def _decay(T: _Terms, p: dict[str, float]) -> tuple[np.ndarray, list[tuple[np.ndarray, ...]]]:
    """(LD/B, per decaying curve (x = η_k^−gamma·S_k(t), q = C·x + 1)): the decay term, the costly part of the law
    (a sum over every decay step at every measurement)."""
    ld = np.zeros_like(T.area)
    xq = []
    for d in T.decays:
        x = np.exp(-p["gamma"] * d.log_lr)[None, :] * d.after
        q = p["C"] * x + 1.0
        ld[d.rows] = (d.drop * (1.0 - q ** -p["beta"])).sum(axis=1)
        xq.append((x, q))
    return ld, xq


def _parts(T: _Terms, p: dict[str, float]) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, ...]]]:
    """(A·area^−alpha, LD/B, per decaying curve (x, q) as `_decay` gives them)."""
    return p["A"] * T.area ** -p["alpha"], *_decay(T, p)


def _predict(T: _Terms, p: dict[str, float]) -> np.ndarray:
    power, ld, _ = _parts(T, p)
    return p["L0"] + power - p["B"] * ld


def predict(params: dict[str, float], curve: Curve) -> np.ndarray:
    """L̂ at ``curve.steps`` under ``curve.lr`` (params in the units of the fit's LRs, as ``fit_curves`` reports)."""
    return _predict(_terms([curve], 1.0), params)


class _Problem:
    """The objective of a curve fit in fitted coordinates (log of scales, exponents as is) over the free
    parameters, with its exact gradient; LRs rescaled so that the largest is 1."""

    def __init__(self, law: CurveLaw, T: _Terms, loss: np.ndarray, fixed: dict[str, float], delta: float) -> None:
        self.law, self.T, self.y, self.fixed, self.delta = law, T, np.log(loss), fixed, delta
        self.free = tuple(p for p in law.params if p.name not in fixed)
        # with the decay parameters fixed (another fit's, or pooled) the decay term is a constant: computed once
        self.fixed_decay = _decay(T, fixed)[0] if set(DECAY_PARAMS) <= set(fixed) else None

    def params(self, theta: np.ndarray) -> dict[str, float]:
        return {**self.fixed, **{p.name: p.to_user(t) for p, t in zip(self.free, theta, strict=True)}}

    def rows(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(L̂, ∂L̂/∂θ): the prediction at every measurement and its exact derivatives (n, free)."""
        p = self.params(theta)
        power = p["A"] * self.T.area ** -p["alpha"]
        ld, xq = (self.fixed_decay, []) if self.fixed_decay is not None else _decay(self.T, p)
        pred = np.maximum(p["L0"] + power - p["B"] * ld, 1e-12)  # a negative L̂ is a huge residual, not a NaN
        dC, dbeta, dgamma = np.zeros_like(pred), np.zeros_like(pred), np.zeros_like(pred)
        if self.fixed_decay is None:  # the decay parameters are free: their derivatives
            for d, (x, q) in zip(self.T.decays, xq, strict=True):
                bq = d.drop * p["beta"] * q ** (-p["beta"] - 1.0) * p["C"] * x  # ∂G/∂log C, times the drop
                dC[d.rows] = -p["B"] * bq.sum(axis=1)
                dbeta[d.rows] = -p["B"] * (d.drop * q ** -p["beta"] * np.log(q)).sum(axis=1)
                dgamma[d.rows] = p["B"] * (bq * d.log_lr[None, :]).sum(axis=1)
        d = {"L0": np.full_like(pred, p["L0"]), "A": power, "alpha": -power * np.log(self.T.area),
             "B": -p["B"] * ld, "C": dC, "beta": dbeta, "gamma": dgamma}
        return pred, np.column_stack([d[f.name] for f in self.free])

    def value_and_grad(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        pred, J = self.rows(theta)
        r = np.log(pred) - self.y
        a = np.abs(r)
        f = float(np.where(a <= self.delta, 0.5 * r * r, self.delta * (a - 0.5 * self.delta)).sum())
        return f, (np.clip(r, -self.delta, self.delta) / pred) @ J

    def starts(self) -> np.ndarray:
        """The exponent (and C) grid, each point with L0, A, B from a least-squares fit of relative error."""
        grids = []
        for p in self.free:
            if p.name == "C":
                grids.append(tuple(np.log(_c_starts(p, self.T))))
            elif p.kind == "exponent":
                grids.append(p.starts)
            else:
                grids.append((np.nan,))  # a linear scale: solved below
        out = []
        for point in itertools.product(*grids):
            theta = np.array(point, dtype=float)
            out.append(self._project(theta))
        return np.array(out)

    def _project(self, theta: np.ndarray) -> np.ndarray:
        linear = [i for i, p in enumerate(self.free) if np.isnan(theta[i])]
        probe = theta.copy()
        probe[linear] = 0.0  # scales 1: their columns are the basis
        p = self.params(probe)
        power, ld, _ = _parts(self.T, {**p, "A": 1.0})
        basis = {"L0": np.ones_like(power), "A": power, "B": -ld}
        loss = np.exp(self.y)
        fixed_part = sum((self.fixed[n] * basis[n] for n in basis if n in self.fixed), np.zeros_like(loss))
        names = [self.free[i].name for i in linear]
        M = np.column_stack([basis[n] / loss for n in names])
        s = np.linalg.lstsq(M, (loss - fixed_part) / loss, rcond=None)[0]
        floor = 0.01 / np.maximum(np.abs(M).mean(axis=0), 1e-300)  # each term >= 1% of the loss (fit.py's reason)
        s = np.where(np.isfinite(s), np.maximum(s, floor), floor)
        theta[linear] = np.log(s)
        return theta

    def objective(self, theta: np.ndarray) -> float:
        with np.errstate(all="ignore"):
            f = self.value_and_grad(theta)[0]
        return f if np.isfinite(f) else np.inf

    def minimize(self, start: np.ndarray, options: FitOptions) -> StartResult:
        """L-BFGS-B with the exponents held in their boxes: one decay barely tells beta from B (beta -> 0 with
        B·beta fixed is a valley), and unbounded BFGS walks that valley for thousands of steps."""
        bounds = [p.bounds if p.kind == "exponent" else (None, None) for p in self.free]
        start = np.array([np.clip(t, *b) if b[0] is not None else t for t, b in zip(start, bounds, strict=True)])
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            res = minimize(self.value_and_grad, start, jac=True, method="L-BFGS-B", bounds=bounds,
                           options={"gtol": options.gtol, "maxiter": options.maxiter})
        finite = bool(np.isfinite(res.fun)) and bool(np.all(np.abs(res.x) < 700))
        message = str(res.message) if finite else "diverged (a parameter ran off to infinity)"
        return StartResult(tuple(map(float, start)), tuple(map(float, res.x)), float(res.fun),
                           bool(res.success) and finite, int(res.nit), message)


def _c_starts(p: Param, T: _Terms) -> tuple[float, ...]:
    return tuple(s / T.decay_area for s in p.starts)


def fit_curves(curves: list[Curve], fixed: dict[str, float] | None = None, law: CurveLaw = MULTI_POWER,
               options: FitOptions | None = None) -> FitResult:
    """Fit ``law`` to the measured losses of ``curves`` (trunks and decays, each with its own schedule).

    ``fixed`` (user units) holds parameters not fitted; with no decaying curve the decay parameters must be among
    them. The result's params are in the units of the LRs given.
    """
    options = options or FitOptions()
    fixed = dict(fixed or {})
    unknown = set(fixed) - set(law.param_names)
    if unknown:
        raise FitError(f"law {law.name!r} has no parameter(s) {', '.join(sorted(unknown))}; its parameters are "
                       f"{', '.join(law.param_names)}")
    if any(c.loss is None for c in curves) or not curves:
        raise FitError("every curve fitted needs its measured losses")
    scale = max(float(c.lr.max()) for c in curves)
    T = _terms(curves, scale)
    if T.decay_area == 0 and not set(DECAY_PARAMS) <= set(fixed):
        raise FitError(f"no curve decays, so {', '.join(DECAY_PARAMS)} are not identified: fix them (e.g. from a "
                       f"fit of another run's decays) or add a curve whose LR decays")
    fixed_unit = _fixed_unit(fixed, scale)
    loss = np.concatenate([c.loss for c in curves])
    n_free = len(law.params) - len(fixed)
    if loss.size <= n_free:
        raise FitError(f"{n_free} free parameter(s) but {loss.size} measured loss(es); need at least {n_free + 1}")
    problem = _Problem(law, T, loss, fixed_unit, options.delta)
    grid = problem.starts()
    values = np.array([problem.objective(t) for t in grid])
    order = np.argsort(values, kind="stable")[: options.n_starts]
    starts = tuple(problem.minimize(grid[i], options) for i in order)
    best = best_start(starts, f"law {law.name!r} on {len(curves)} curve(s)")
    unit = problem.params(np.array(best.end))
    params = {**_user_params(unit, scale), **fixed}
    warnings = tuple(f"{p.name}={params[p.name]:.4g} is outside its plausible range [{p.bounds[0]:g}, "
                     f"{p.bounds[1]:g}]" for p in problem.free if not p.bounds[0] <= params[p.name] <= p.bounds[1])
    h = hashlib.sha256()
    for c in curves:
        for a in (c.lr, c.steps.astype(float), c.loss):
            h.update(np.ascontiguousarray(a).tobytes())
    record = FitProvenance(FITTER_VERSION, "L-BFGS-B", "sum", options.tolerances(),
                           {p.name: p.starts for p in problem.free}, len(grid), len(starts), h.hexdigest()[:16])
    return FitResult(law.name, params, fixed, tuple(p.name for p in problem.free), best.end, best.objective, True,
                     int(loss.size), starts, record, warnings)
