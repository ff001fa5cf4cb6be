"""Model comparison on one table: leave-one-out RMS, leave-largest-out extrapolation error, AIC and BIC.

LOO and extrapolation errors are RMS in loss units (as the paper's Table 1), so they read as "how far off is a
prediction". LOO refits warm-start from the full fit (the optimum barely moves when one point leaves); the
extrapolation fit is a fresh multi-start on the smaller budgets only, so nothing of the held-out rows leaks in.
AIC/BIC use the Gaussian likelihood of the log residuals: n·log(RSS/n) + 2k and + k·log n.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from upscale.fitting.errors import FitError
from upscale.fitting.fit import (
    FitOptions,
    FitProblem,
    FitResult,
    StartResult,
    fit_problem,
    prepare,
    refit_theta,
    run_starts,
)
from upscale.fitting.laws import Law


@dataclass(frozen=True)
class Comparison:
    """One law's row of the comparison table (errors in loss units; NaN where not computable)."""

    law: str
    n_points: int
    n_free: int
    objective: float
    loo_rms: float
    extrapolation_rms: float
    aic: float
    bic: float

    def to_json(self) -> dict[str, float | int | str | None]:
        return {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in asdict(self).items()}


def loo_rms(problem: FitProblem, best: StartResult, options: FitOptions,
            progress: Callable[[int], None] | None = None) -> float:
    """RMS over rows of (prediction of the row from a fit without it) − observed, in loss units; ``progress(1)`` is
    told of every refit."""
    errors = np.empty(problem.n)
    everything = np.arange(problem.n)
    for i in everything:
        t = refit_theta(problem.subset(np.delete(everything, i)), best, options)
        if t is None:
            raise FitError(f"the leave-one-out refit without row {i + 1} did not converge; loo_rms is not reported")
        if progress:
            progress(1)
        row = problem.subset(np.array([i]))
        errors[i] = np.exp(row.log_predict(t)[0]) - np.exp(row.y[0])
    return float(np.sqrt(np.mean(errors**2)))


def extrapolation_rms(law: Law, table: pd.DataFrame, problem: FitProblem, options: FitOptions) -> float:
    """Fit on rows below the largest value of the law's holdout column, RMS error on the rows at it; NaN when
    too few rows remain to fit."""
    col = table[law.holdout].to_numpy()
    test = col == col.max()
    train = problem.subset(np.flatnonzero(~test))
    if train.n <= len(problem.names) or not test.any():
        return float("nan")
    ok = [s for s in run_starts(train, options)[0] if s.converged]
    if not ok:
        return float("nan")
    held = problem.subset(np.flatnonzero(test))
    theta = np.array(min(ok, key=lambda s: s.objective).end)
    return float(np.sqrt(np.mean((np.exp(held.log_predict(theta)) - np.exp(held.y)) ** 2)))


def information_criteria(problem: FitProblem, theta: np.ndarray) -> tuple[float, float]:
    """(AIC, BIC) from the log residuals of the fit."""
    n, k = problem.n, len(problem.names)
    rss = float(np.sum((problem.log_predict(theta) - problem.y) ** 2))
    base = n * np.log(max(rss, 1e-300) / n)
    return float(base + 2 * k), float(base + k * np.log(n))


def assess(law: Law, df: pd.DataFrame, result: FitResult, options: FitOptions | None = None, *,
           prepared: tuple[FitProblem, pd.DataFrame] | None = None,
           progress: Callable[[int], None] | None = None) -> Comparison:
    """The comparison row of an existing fit of ``law`` to ``df``; ``prepared``: what ``prepare`` returned for this
    fit (law, df, result.fixed, options), if the caller has it. ``progress(1)`` is told of each LOO refit and of the
    extrapolation fit."""
    options = options or FitOptions()
    problem, table = prepared or prepare(law, df, result.fixed, options)
    theta = np.array(result.theta)
    aic, bic = information_criteria(problem, theta)
    loo = loo_rms(problem, result.best, options, progress)
    extrapolation = extrapolation_rms(law, table, problem, options)
    if progress:
        progress(1)
    return Comparison(law.name, problem.n, len(problem.names), result.objective, loo, extrapolation, aic, bic)


def compare_steps(laws: list[Law], df: pd.DataFrame) -> int:
    """How many ``progress(1)`` calls ``compare`` makes: per law its fit, one LOO refit a row, the extrapolation fit."""
    return len(laws) * (len(df) + 2)


def compare(laws: list[Law], df: pd.DataFrame, fixed: dict[str, float] | None = None,
            options: FitOptions | None = None, progress: Callable[[int], None] | None = None) -> list[Comparison]:
    """Fit every law to the same table and assess it; rows in the order given. ``progress(1)`` is told of every fit
    (``compare_steps`` of them)."""
    options = options or FitOptions()
    rows = []
    for law in laws:
        own = {k: v for k, v in (fixed or {}).items() if k in law.param_names}
        prepared = prepare(law, df, own, options)
        result = fit_problem(law, *prepared, own, options)
        if progress:
            progress(1)
        rows.append(assess(law, df, result, options, prepared=prepared, progress=progress))
    return rows
