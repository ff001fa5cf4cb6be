"""Refit faults injected on purpose: a LOO or bootstrap refit that fails is rare on real data and hard to provoke
deterministically, so the tests patch ``refit_theta`` (what every LOO and bootstrap refit calls) to fail for chosen
refits and check that the failure is counted and reported, never fatal."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from upscale.fitting import fit as fit_module
from upscale.fitting.errors import FitError


def fail(how: str, n_params: int) -> np.ndarray | None:
    """One failed refit: raise FitError ("raise"), not converge ("none") or end at a NaN point ("nan")."""
    if how == "raise":
        raise FitError("injected refit failure")
    return None if how == "none" else np.full(n_params, np.nan)


def failing_loo_rows(monkeypatch, loss: np.ndarray, rows: Iterable[int], how: str = "raise",
                     n_free: int | None = None) -> None:
    """Make the LOO refit without any of the 1-based ``rows`` of the table whose losses are ``loss`` fail; only refits
    of that table (a subset of its rows, one short) and, with ``n_free``, only of laws with that many parameters."""
    real = fit_module.refit_theta
    table = {float(v) for v in np.log(loss)}
    target = {float(np.log(loss[r - 1])) for r in rows}

    def refit(problem, best, options):
        ys = {float(v) for v in problem.y}
        if (problem.n == len(loss) - 1 and ys <= table and target - ys
                and (n_free is None or len(problem.names) == n_free)):
            return fail(how, len(problem.names))
        return real(problem, best, options)

    monkeypatch.setattr(fit_module, "refit_theta", refit)


def failing_calls(monkeypatch, calls: dict[int, str]) -> None:
    """Make the refits at these 0-based call numbers fail as ``calls`` says (see ``fail``); for sequential runs, where
    a report makes its bootstrap refits first, in draw order, then one LOO refit a row."""
    real = fit_module.refit_theta
    count = iter(range(10**9))

    def refit(problem, best, options):
        k = next(count)
        return fail(calls[k], len(problem.names)) if k in calls else real(problem, best, options)

    monkeypatch.setattr(fit_module, "refit_theta", refit)
