"""Model comparison on one table: leave-one-out RMS, leave-largest-out extrapolation error, AIC and BIC.

LOO and extrapolation errors are RMS in loss units (as the paper's Table 1), so they read as "how far off is a
prediction". LOO refits warm-start from the full fit (the optimum barely moves when one point leaves); the
extrapolation fit is a fresh multi-start on the smaller budgets only, so nothing of the held-out rows leaks in.
AIC/BIC use the Gaussian likelihood of the log residuals: n·log(RSS/n) + 2k and + k·log n.

A LOO refit that fails (does not converge, raises, ends non-finite) is skipped and counted: LOO RMS is over the
refits that succeeded, and not reported (NaN, null in JSON) when more than a quarter of them failed. Either way the
comparison row says how many failed and without which rows, so one bad refit never costs a law its comparison.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from upscale.fitting.fit import (
    FitOptions,
    FitProblem,
    FitResult,
    StartResult,
    fit_problem,
    prepare,
    run_starts,
    try_refit,
)
from upscale.fitting.laws import Law

MAX_LOO_FAILED = 0.25  # the share of LOO refits that may fail before LOO RMS is not reported


@dataclass(frozen=True)
class Comparison:
    """One law's row of the comparison table (errors in loss units; NaN where not computable). ``loo_failed``: how
    many LOO refits failed, ``loo_failed_rows`` without which (1-based) rows, ``loo_note`` what that means for
    ``loo_rms`` (None when every refit succeeded)."""

    law: str
    n_points: int
    n_free: int
    objective: float
    loo_rms: float
    extrapolation_rms: float
    aic: float
    bic: float
    loo_failed: int = 0
    loo_failed_rows: tuple[int, ...] = ()
    loo_note: str | None = None

    def to_json(self) -> dict[str, float | int | str | list[int] | None]:
        out = {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in asdict(self).items()}
        out["loo_failed_rows"] = list(self.loo_failed_rows)
        return out


@dataclass(frozen=True)
class LeaveOneOut:
    """Leave-one-out over a table: the RMS (loss units; NaN when not reported), the 1-based rows whose refit failed
    and, when any did, a note saying how many and what became of the RMS; how many rows were left out when they were
    a sample."""

    rms: float
    n: int
    failed_rows: tuple[int, ...] = ()
    note: str | None = None
    sampled: int | None = None  # rows left out in turn when only a seeded sample of the n was (None: every row)

    @property
    def failed(self) -> int:
        return len(self.failed_rows)

    @property
    def reported(self) -> float | None:
        """The RMS for JSON: None when it is not reported."""
        return float(self.rms) if np.isfinite(self.rms) else None


def _describe_rows(rows: list[int], table: pd.DataFrame | None, columns: tuple[str, ...] = (), limit: int = 5) -> str:
    """1-based ``rows`` as 'row 3 (D=1e+09, N=1e+08), row 7 (...)', with their coordinates when the table is at
    hand, the first ``limit`` of them."""
    def one(r: int) -> str:
        if table is None or not columns:
            return f"row {r}"
        return f"row {r} ({', '.join(f'{c}={float(table[c].iloc[r - 1]):.3g}' for c in columns)})"
    shown = ", ".join(one(r) for r in rows[:limit])
    return shown + (f" and {len(rows) - limit} more" if len(rows) > limit else "")


def leave_one_out(problem: FitProblem, best: StartResult, options: FitOptions,
                  progress: Callable[[int], None] | None = None, *, table: pd.DataFrame | None = None,
                  columns: tuple[str, ...] = (), held_out: int | None = None, seed: int = 0) -> LeaveOneOut:
    """Every row predicted by a fit without it; ``progress(1)`` is told of every refit. A refit that fails is skipped
    and counted; the RMS is over the rest, NaN when more than ``MAX_LOO_FAILED`` of the refits (or all) failed.
    ``table`` and ``columns``: the fitted table and the law's columns, to name the failed rows by their point.
    ``held_out``: with more rows than this, only a sample of that many rows (drawn with ``seed``) is left out in
    turn, so the cost is ``held_out`` refits however large the table; the result says so (`sampled`)."""
    everything = np.arange(problem.n)
    left_out = everything
    if held_out is not None and problem.n > held_out:
        left_out = np.sort(np.random.default_rng(seed).choice(problem.n, held_out, replace=False))
    errors = np.full(problem.n, np.nan)
    for i in left_out:
        t = try_refit(problem.subset(np.delete(everything, i)), best, options)
        if progress:
            progress(1)
        if t is None:
            continue
        row = problem.subset(np.array([i]))
        with np.errstate(over="ignore", invalid="ignore"):
            errors[i] = np.exp(row.log_predict(t)[0]) - np.exp(row.y[0])
    sampled = len(left_out) if len(left_out) < problem.n else None
    errors = errors[left_out]
    bad = [int(i) + 1 for i in left_out[~np.isfinite(errors)]]
    if not bad:
        note = f"LOO RMS over a seeded sample of {sampled} of the {problem.n} rows, left out in turn" \
            if sampled else None
        return LeaveOneOut(float(np.sqrt(np.mean(errors**2))), problem.n, note=note, sampled=sampled)
    head = (f"{len(bad)} of {len(left_out)} leave-one-out refits did not converge "
            f"(without {_describe_rows(bad, table, columns)})")
    if len(bad) == len(left_out) or len(bad) > MAX_LOO_FAILED * len(left_out):
        return LeaveOneOut(float("nan"), problem.n, tuple(bad),
                           f"{head}: more than {MAX_LOO_FAILED:.0%} of them, so LOO RMS is not reported", sampled)
    ok = errors[np.isfinite(errors)]
    return LeaveOneOut(float(np.sqrt(np.mean(ok**2))), problem.n, tuple(bad),
                       f"{head}: LOO RMS is over the other {len(ok)}", sampled)


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
    loo = leave_one_out(problem, result.best, options, progress, table=table, columns=law.columns)
    extrapolation = extrapolation_rms(law, table, problem, options)
    if progress:
        progress(1)
    return Comparison(law.name, problem.n, len(problem.names), result.objective, loo.rms, extrapolation, aic, bic,
                      loo.failed, loo.failed_rows, loo.note)


def compare_steps(laws: list[Law], df: pd.DataFrame) -> int:
    """How many ``progress(1)`` calls ``compare`` makes: per law its fit, one LOO refit a row, the extrapolation fit."""
    return len(laws) * (len(df) + 2)


def compare(laws: list[Law], df: pd.DataFrame, fixed: dict[str, float] | None = None,
            options: FitOptions | None = None, progress: Callable[[int], None] | None = None) -> list[Comparison]:
    """Fit every law to the same table and assess it; rows in the order given. ``progress(1)`` is told of every fit
    (``compare_steps`` of them). A law whose LOO refits fail keeps its row (``loo_failed``, ``loo_note``; ``loo_rms``
    NaN when too many failed), so the other laws are still compared; only a law's own fit failing raises."""
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
