"""The fitter: summed Huber of log L̂ − log L, BFGS with the exact gradient, from a screened multi-start grid.

The paper's procedure (Sec. 4.1, after Hoffmann et al. and the Chinchilla replication), made fast and robust:

* log L̂ = logsumexp_k(X_k·θ) (laws.py), so the objective and its gradient are a few dense numpy products:
  ∂/∂θ Σ huber(r) = Σ_rows ψ(r)·Σ_k softmax_k·X_k with ψ = clip(r, −δ, δ). No numeric differences.
* The objective is the **sum** of Huber(δ = 1e-3) terms (the mean shrinks the gradient n-fold, so BFGS's gradient
  tolerance is met long before the optimum; tests/fitting/test_fit.py shows it).
* Multi-start in two stages: the grid of exponent starts gets its scales by linear least squares (variable
  projection), the objective is evaluated on the whole grid at once (one batched product), then BFGS runs from
  the ``n_starts`` best grid points, in whitened coordinates (see ``FitProblem.whitening``). Every BFGS
  run is kept (start, end point, objective, convergence); the best converged one is the fit. If none converged the
  fit raises FitError: a non-converged fit is never reported as a result.
* Fixed parameters leave θ and enter as a constant offset; several laws on several tables can share parameters
  (the paper's E, fitted jointly from the dense and MoE tables) by stacking their rows into one problem.
* Optional E <= min(L): E's log gets that upper bound and the optimiser becomes L-BFGS-B (BFGS has no bounds).
* Optional row weights (a ``weight`` column; 1 without one): each row's Huber term, and its share of the start
  grid's least-squares scales, counts that many times. A decay end predicted from a trunk's curve counts less than an
  observed one (fitting/curve_observations.py); a LOO or bootstrap refit keeps each row's weight.

Everything is deterministic: grid order, stable sorts, no random numbers.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from upscale.fitting.data import data_hash, validate
from upscale.fitting.errors import FitError
from upscale.fitting.laws import LOSS, WEIGHT, Law, Param

FITTER_VERSION = "1.0.0"
HUBER_DELTA = 1e-3  # the paper's and the Chinchilla replication's δ


@dataclass(frozen=True)
class FitOptions:
    """How a fit is run; recorded with every fit."""

    delta: float = HUBER_DELTA
    reduction: Literal["sum", "mean"] = "sum"  # "mean" exists to demonstrate why the sum is used
    n_starts: int = 8  # BFGS runs, from the best points of the start grid
    gtol: float = 1e-8  # gradient inf-norm in whitened coordinates; 1e-5 stops ~1% of the objective short
    maxiter: int = 2000
    bound_E: bool = False  # constrain E <= min observed loss

    def tolerances(self) -> dict[str, float]:
        return {"delta": self.delta, "gtol": self.gtol, "maxiter": self.maxiter}


@dataclass(frozen=True)
class StartResult:
    """One BFGS run: where it started and ended (fitted coordinates), its objective and whether it converged."""

    start: tuple[float, ...]
    end: tuple[float, ...]
    objective: float
    converged: bool
    n_iter: int
    message: str
    # BFGS's inverse Hessian at the end, in fitted coordinates: warm-starts refits on resampled rows
    hess_inv: np.ndarray | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class FitProvenance:
    """What is needed to reproduce a fit: versions, grid, tolerances and the hash of the data."""

    fitter_version: str
    method: str
    reduction: str
    tolerances: dict[str, float]
    grid: dict[str, tuple[float, ...]]
    n_grid: int
    n_starts: int
    data_hash: str


@dataclass(frozen=True)
class FitResult:
    """A converged fit. ``params`` holds every parameter in user units (free and fixed)."""

    law: str
    params: dict[str, float]
    fixed: dict[str, float]
    free: tuple[str, ...]
    theta: tuple[float, ...]  # the free parameters in fitted coordinates (log for scales)
    objective: float
    converged: bool
    n_points: int
    starts: tuple[StartResult, ...]
    record: FitProvenance
    warnings: tuple[str, ...] = field(default=())

    @property
    def best(self) -> StartResult:
        """The run the fit reports (lowest objective among the converged ones)."""
        return min((s for s in self.starts if s.converged), key=lambda s: s.objective)

    def to_json(self) -> dict[str, Any]:
        return {
            "law": self.law,
            "params": self.params,
            "fixed": self.fixed,
            "objective": self.objective,
            "converged": self.converged,
            "n_points": self.n_points,
            "warnings": list(self.warnings),
            "record": {**self.record.__dict__, "grid": {k: list(v) for k, v in self.record.grid.items()}},
            "starts": [
                {"start": list(s.start), "end": list(s.end), "objective": s.objective, "converged": s.converged,
                 "n_iter": s.n_iter, "message": s.message}
                for s in self.starts
            ],
        }


@dataclass
class FitProblem:
    """The numerics of one fit: design tensor, constant offset, targets. Rows can be subset for LOO/bootstrap."""

    names: tuple[str, ...]  # free parameters, in θ order
    params: tuple[Param, ...]  # their declarations (kind, starts, bounds)
    X: np.ndarray  # (K terms, n rows, p free)
    offset: np.ndarray  # (K, n): fixed parameters' contribution; −inf pads laws with fewer terms
    y: np.ndarray  # (n,) log loss
    w: np.ndarray  # (n,) each row's weight (1: an observation)
    delta: float
    reduction: str
    upper: np.ndarray  # (p,) upper bound per free parameter in fitted coordinates (+inf = none)

    @property
    def n(self) -> int:
        return self.y.shape[0]

    def subset(self, rows: np.ndarray) -> FitProblem:
        return FitProblem(self.names, self.params, self.X[:, rows, :], self.offset[:, rows], self.y[rows],
                       self.w[rows], self.delta, self.reduction, self.upper)

    def log_predict(self, theta: np.ndarray) -> np.ndarray:
        Z = self.X @ theta + self.offset
        m = Z.max(axis=0)
        return m + np.log(np.exp(Z - m).sum(axis=0))

    def value_and_grad(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        Z = self.X @ theta + self.offset
        m = Z.max(axis=0)
        W = np.exp(Z - m)
        s = W.sum(axis=0)
        r = m + np.log(s) - self.y
        a = np.abs(r)
        f = (self.w * np.where(a <= self.delta, 0.5 * r * r, self.delta * (a - 0.5 * self.delta))).sum()
        psi = self.w * np.clip(r, -self.delta, self.delta) / s
        g = np.einsum("kn,knp->p", W * psi, self.X)
        if self.reduction == "mean":
            return f / self.n, g / self.n
        return float(f), g

    def screen(self, grid: np.ndarray, chunk: int = 4096) -> np.ndarray:
        """The objective at every row of ``grid`` (G, p), batched so memory stays ~K·n·chunk floats."""
        out = np.empty(grid.shape[0])
        for i in range(0, grid.shape[0], chunk):
            T = grid[i:i + chunk].T  # (p, g)
            Z = np.einsum("knp,pg->kng", self.X, T) + self.offset[:, :, None]
            m = Z.max(axis=0)
            r = m + np.log(np.exp(Z - m).sum(axis=0)) - self.y[:, None]
            a = np.abs(r)
            h = self.w[:, None] * np.where(a <= self.delta, 0.5 * r * r, self.delta * (a - 0.5 * self.delta))
            out[i:i + chunk] = h.sum(axis=0) / (self.n if self.reduction == "mean" else 1.0)
        return np.where(np.isfinite(out), out, np.inf)

    def project_scales(self, grid_exp: np.ndarray, chunk: int = 2048) -> np.ndarray:
        """Full starts (G, p) from exponent starts (G, q): the free scales solve a weighted linear least squares.

        With the exponents fixed the law is linear in its scales, L = fixed part + Σ_j S_j·basis_j; minimising the
        weighted relative error Σ w·((L − L̂)/L)² (w: the rows' weights) gives S by a (J×J) solve per start. A term
        is kept alive at >= 1% of the loss on average: a negative or tiny solution would leave it negligible, where
        its gradient vanishes and BFGS stops at once on a plateau; from 1% BFGS can still shrink it if the data want.
        """
        is_scale = np.array([p.kind == "scale" for p in self.params])
        si, ei = np.flatnonzero(is_scale), np.flatnonzero(~is_scale)
        full = np.zeros((grid_exp.shape[0], len(self.params)))
        full[:, ei] = grid_exp
        if si.size == 0:
            return full
        loss = np.exp(self.y)
        Xs = self.X[:, :, si]  # (K, n, J): which free scale each term carries (0/1)
        free_term = Xs.sum(axis=2)  # (K, n): 1 where the term's scale is free
        for i in range(0, grid_exp.shape[0], chunk):
            T = grid_exp[i:i + chunk].T  # (q, g)
            with np.errstate(over="ignore"):
                W = np.exp(np.minimum(np.einsum("knq,qg->kng", self.X[:, :, ei], T) + self.offset[:, :, None], 700))
            basis = np.einsum("knj,kng->gnj", Xs, W) / loss[None, :, None]  # (g, n, J), relative units
            fixed_part = np.einsum("kn,kng->gn", 1.0 - free_term, W)
            target = (loss[None, :] - fixed_part) / loss[None, :]
            weighted = basis * self.w[None, :, None]
            G = np.einsum("gnj,gnl->gjl", weighted, basis) + 1e-12 * np.eye(si.size)
            b = np.einsum("gnj,gn->gj", weighted, target)
            S = np.linalg.solve(G, b[..., None])[..., 0]
            floor = 0.01 / np.maximum(basis.mean(axis=1), 1e-300)  # S_j·mean(basis_j) = 1% of the loss
            S = np.where(np.isfinite(S), S, floor)
            full[i:i + chunk, si] = np.log(np.maximum(S, floor))
        return full

    @cached_property
    def whitening(self) -> tuple[np.ndarray, np.ndarray]:
        """(R, R⁻¹) with θ = R⁻¹·φ making the stacked design's columns orthonormal: BFGS in φ needs far fewer steps
        (raw log-count columns are ~25 times the constant column and nearly collinear with it). Computed once per
        problem, shared by all its starts."""
        R = self._whitening_matrix()
        return R, np.linalg.inv(R)

    def _whitening_matrix(self) -> np.ndarray:
        finite = np.isfinite(self.offset).reshape(-1)
        flat = self.X.reshape(-1, self.X.shape[2])[finite]
        R = np.linalg.qr(flat, mode="r")
        if np.linalg.cond(R) > 1e12:  # a rank-deficient design: fall back to scaling each column
            return np.diag(np.maximum(np.linalg.norm(flat, axis=0), 1e-12))
        d = np.sign(np.diag(R))
        d[d == 0] = 1.0
        return d[:, None] * R

    def minimize(self, start: np.ndarray, options: FitOptions, hess_inv: np.ndarray | None = None) -> StartResult:
        """One run from ``start``; ``hess_inv`` (fitted coordinates, e.g. of the full fit) seeds BFGS's curvature,
        which makes a refit on resampled rows take a fraction of the steps."""
        start = np.minimum(np.asarray(start, dtype=float), self.upper)
        H = None
        bounded = bool(np.isfinite(self.upper).any())
        with np.errstate(over="ignore", invalid="ignore"):
            if bounded:
                res = minimize(self.value_and_grad, start, jac=True, method="L-BFGS-B",
                               bounds=[(None, u if np.isfinite(u) else None) for u in self.upper],
                               options={"gtol": options.gtol, "maxiter": options.maxiter})
                x = res.x
            else:
                R, R_inv = self.whitening

                def fg(phi: np.ndarray) -> tuple[float, np.ndarray]:
                    f, g = self.value_and_grad(R_inv @ phi)
                    return f, R_inv.T @ g

                h0 = None if hess_inv is None else R @ hess_inv @ R.T
                if h0 is not None:
                    h0 = (h0 + h0.T) / 2
                    h0 = h0 if np.linalg.eigvalsh(h0).min() > 0 else None  # scipy needs it positive definite
                res = minimize(fg, R @ start, jac=True, method="BFGS",
                               options={"gtol": options.gtol, "maxiter": options.maxiter, "hess_inv0": h0})
                x = R_inv @ res.x
                H = R_inv @ res.hess_inv @ R_inv.T
        # |θ| < 700 keeps exp(θ) finite: a scale that overflows is a divergence, not a converged fit
        finite = bool(np.isfinite(res.fun)) and bool(np.all(np.abs(x) < 700))
        message = str(res.message) if finite else "diverged (a parameter ran off to infinity)"
        return StartResult(tuple(map(float, start)), tuple(map(float, x)), float(res.fun), bool(res.success) and finite,
                           int(res.nit), message, H)


def _fixed_fitted(law: Law, p: Param, value: float) -> float:
    if p.kind == "scale" and not value > 0:
        raise FitError(f"fixed {p.name}={value} must be positive (it is a scale of law {law.name!r})")
    return p.to_fitted(value)


def build_problem(
    blocks: list[tuple[Law, pd.DataFrame, dict[str, str]]],
    fixed: dict[str, float],
    options: FitOptions,
) -> FitProblem:
    """One problem from several (law, validated table, rename) blocks; rename maps a law's parameter names to
    the problem's (shared parameters map to the same name). ``fixed`` is keyed by the problem's names."""
    names: list[str] = []
    decl: dict[str, Param] = {}
    for law, _, rename in blocks:
        for p in law.params:
            n = rename.get(p.name, p.name)
            if n not in fixed and n not in decl:
                names.append(n)
                decl[n] = p
    K = max(len(law.terms) for law, _, _ in blocks)
    Xs, offs, ys, ws = [], [], [], []
    for law, df, rename in blocks:
        own = tuple(rename.get(p, p) for p in law.param_names)
        X_full = law.design(df)
        theta_fixed = np.array([_fixed_fitted(law, p, fixed[n]) if n in fixed else 0.0
                                for p, n in zip(law.params, own, strict=True)])
        off = X_full @ theta_fixed
        cols = [own.index(n) if n in own else None for n in names]
        X = np.zeros((K, len(df), len(names)))
        for j, c in enumerate(cols):
            if c is not None:
                X[: len(law.terms), :, j] = X_full[:, :, c]
        pad = np.full((K - len(law.terms), len(df)), -np.inf)
        Xs.append(X)
        offs.append(np.vstack([off, pad]))
        ys.append(np.log(df[LOSS].to_numpy(dtype=float)))
        ws.append(df[WEIGHT].to_numpy(dtype=float) if WEIGHT in df.columns else np.ones(len(df)))
    upper = np.full(len(names), np.inf)
    if options.bound_E and "E" in names:
        upper[names.index("E")] = float(np.min(np.concatenate(ys)))
    return FitProblem(tuple(names), tuple(decl[n] for n in names), np.concatenate(Xs, axis=1),
                   np.concatenate(offs, axis=1), np.concatenate(ys), np.concatenate(ws), options.delta,
                      options.reduction, upper)


def start_grid(problem: FitProblem) -> np.ndarray:
    """Every start (G, p): the Cartesian product of the exponents' starts, each with its least-squares scales."""
    exps = [p.starts for p in problem.params if p.kind == "exponent"]
    grid_exp = np.array(list(itertools.product(*exps)), dtype=float).reshape(-1, len(exps))
    return np.minimum(problem.project_scales(grid_exp), problem.upper)


def run_starts(problem: FitProblem, options: FitOptions) -> tuple[tuple[StartResult, ...], int]:
    """BFGS from the ``n_starts`` best grid points; returns every run and the grid size."""
    grid = start_grid(problem)
    values = problem.screen(grid)
    order = np.argsort(values, kind="stable")[: options.n_starts]
    return tuple(problem.minimize(grid[i], options) for i in order), len(grid)


def best_start(starts: tuple[StartResult, ...], what: str) -> StartResult:
    ok = [s for s in starts if s.converged]
    if not ok:
        msgs = sorted({s.message for s in starts})
        raise FitError(f"the fit of {what} did not converge from any of {len(starts)} start(s) "
                       f"({'; '.join(msgs)}); it is not reported")
    return min(ok, key=lambda s: s.objective)


def user_params(problem: FitProblem, theta: np.ndarray, fixed: dict[str, float]) -> dict[str, float]:
    out = {n: p.to_user(t) for n, p, t in zip(problem.names, problem.params, theta, strict=True)}
    return {**out, **{k: float(v) for k, v in fixed.items()}}


def _flag_bounds(problem: FitProblem, params: dict[str, float]) -> tuple[str, ...]:
    out = []
    for n, p in zip(problem.names, problem.params, strict=True):
        lo, hi = p.bounds
        if not lo <= params[n] <= hi:
            out.append(f"{n}={params[n]:.4g} is outside its plausible range [{lo:g}, {hi:g}]")
    return tuple(out)


def _finish(label: str, problem: FitProblem, starts: tuple[StartResult, ...], n_grid: int, fixed: dict[str, float],
            options: FitOptions, hash_: str) -> FitResult:
    best = best_start(starts, label)
    theta = np.array(best.end)
    params = user_params(problem, theta, fixed)
    record = FitProvenance(FITTER_VERSION, "L-BFGS-B" if np.isfinite(problem.upper).any() else "BFGS",
                       options.reduction, options.tolerances(), {n: p.starts for n, p in
                                                                  zip(problem.names, problem.params, strict=True)},
                       n_grid, len(starts), hash_)
    return FitResult(label, params, dict(fixed), problem.names, tuple(map(float, theta)), best.objective, True,
                     problem.n, starts, record, _flag_bounds(problem, params))


def prepare(law: Law, df: pd.DataFrame, fixed: dict[str, float] | None,
            options: FitOptions) -> tuple[FitProblem, pd.DataFrame]:
    """Validate ``df`` for ``law`` and build its problem (the CLI and the bootstrap share this)."""
    fixed = dict(fixed or {})
    for name in fixed:
        law.param(name)  # raises on an unknown name
    table = validate(law, df, n_free=len(law.params) - len(fixed))
    return build_problem([(law, table, {})], fixed, options), table


def fit(law: Law, df: pd.DataFrame, fixed: dict[str, float] | None = None,
        options: FitOptions | None = None) -> FitResult:
    """Fit ``law`` to the table ``df`` (columns: the law's variables and ``loss``)."""
    options = options or FitOptions()
    problem, table = prepare(law, df, fixed, options)
    return fit_problem(law, problem, table, fixed, options)


def fit_from(law: Law, df: pd.DataFrame, start: dict[str, float], fixed: dict[str, float] | None = None,
             options: FitOptions | None = None) -> FitResult | None:
    """``fit`` as one BFGS run from ``start`` (user units: a fit of the same law on more of the data, or of a law it
    nests) instead of the multi-start; None when that run does not converge (then the multi-start is the way)."""
    options = options or FitOptions()
    problem, table = prepare(law, df, fixed, options)
    theta = np.array([p.to_fitted(start[n]) for n, p in zip(problem.names, problem.params, strict=True)])
    run = problem.minimize(theta, options)
    if not run.converged:
        return None
    return _finish(law.name, problem, (run,), 0, dict(fixed or {}), options, data_hash(table, tuple(table.columns)))


def fit_problem(law: Law, problem: FitProblem, table: pd.DataFrame, fixed: dict[str, float] | None,
                options: FitOptions) -> FitResult:
    """``fit`` of the (problem, table) that ``prepare`` built for (law, fixed, options): for callers that go on
    with the same problem (a report's LOO and bootstrap, a comparison's assessment), so that it is built once."""
    starts, n_grid = run_starts(problem, options)
    return _finish(law.name, problem, starts, n_grid, dict(fixed or {}), options,
                   data_hash(table, tuple(table.columns)))


def refit_theta(problem: FitProblem, best: StartResult, options: FitOptions) -> np.ndarray | None:
    """The optimum of ``problem`` (rows resampled or left out) warm-started at the full fit's ``best`` run (its end
    point and curvature); the full multi-start if that does not converge; None if nothing converges."""
    first = problem.minimize(np.array(best.end), options, best.hess_inv)
    if first.converged:
        return np.array(first.end)
    ok = [s for s in run_starts(problem, options)[0] if s.converged]
    return np.array(min(ok, key=lambda s: s.objective).end) if ok else None


REFIT_ERRORS = (ValueError, ArithmeticError)  # FitError and numpy's LinAlgError are ValueErrors; overflow, x/0


def try_refit(problem: FitProblem, best: StartResult, options: FitOptions) -> np.ndarray | None:
    """``refit_theta``, with None for a refit that failed in any way: not converged, raised (FitError, a singular
    matrix, an overflow) or ended at a non-finite point. A LOO or bootstrap refit that fails is counted and reported
    by its caller; it never takes the fit it belongs to down with it."""
    try:
        theta = refit_theta(problem, best, options)
    except REFIT_ERRORS:
        return None
    return theta if theta is not None and bool(np.all(np.isfinite(theta))) else None


def fit_shared(
    tables: dict[str, tuple[Law, pd.DataFrame]],
    shared: tuple[str, ...] = ("E",),
    fixed: dict[str, float] | None = None,
    options: FitOptions | None = None,
) -> FitResult:
    """Fit several laws on several tables at once with the ``shared`` parameters common to all of them.

    ``tables`` maps a label (e.g. "dense", "moe") to (law, table). The result's parameters are named
    ``label.name`` except the shared ones (the paper fits E this way from the dense and MoE tables, Sec. 5).
    ``fixed`` is keyed by those result names.
    """
    options = options or FitOptions()
    fixed = dict(fixed or {})
    problem, label, digest = shared_problem(tables, shared, fixed, options)
    starts, n_grid = run_starts(problem, options)
    return _finish(label, problem, starts, n_grid, fixed, options, digest)


def shared_problem(tables: dict[str, tuple[Law, pd.DataFrame]], shared: tuple[str, ...], fixed: dict[str, float],
                   options: FitOptions) -> tuple[FitProblem, str, str]:
    """``fit_shared``'s problem (its rows: the tables' rows one table after the other, in order), its label and
    its data hash: for refits of the same joint fit (a bootstrap)."""
    blocks, hashes = [], []
    for label, (law, df) in tables.items():
        rename = {p: (p if p in shared else f"{label}.{p}") for p in law.param_names}
        n_free = sum(1 for p in law.param_names if rename[p] not in fixed)
        table = validate(law, df, n_free=n_free)
        blocks.append((law, table, rename))
        hashes.append(data_hash(table, tuple(table.columns)))
    label = "+".join(f"{k}:{law.name}" for k, (law, _) in tables.items())
    return build_problem(blocks, fixed, options), label, "+".join(hashes)


def split_shared(result: FitResult, label: str, law: Law) -> dict[str, float]:
    """One law's parameters (its own names) out of a fit_shared result."""
    return {p: result.params[p] if p in result.params else result.params[f"{label}.{p}"] for p in law.param_names}
