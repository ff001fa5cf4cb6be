"""Bootstrap refits and percentile intervals.

Branches decayed from one WSD trunk share that trunk's noise, so resampling points would understate the
uncertainty: when the table has a ``trunk`` column whole trunks are resampled (cluster bootstrap), otherwise points.
Every draw comes from one seeded ``numpy.random.Generator`` up front and is kept with the result, so the result
does not depend on how many processes refit it. Each refit warm-starts at the full fit (falling back to the
multi-start grid), which makes 1,000 refits of `joint` a matter of seconds. A refit that fails (does not converge,
raises, ends non-finite) is skipped and counted (``n_failed``, and which draws in ``failed``): the intervals are over
the refits that succeeded, and one bad resample never aborts the bootstrap or the fit it belongs to.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
import pandas as pd

from upscale.fitting.fit import FitOptions, FitProblem, FitResult, StartResult, prepare, try_refit, user_params
from upscale.fitting.laws import TRUNK, Law

CI_LEVEL = 0.95


@dataclass(frozen=True)
class Bootstrap:
    """Parameter samples (user units) of the refits that converged, and how they were drawn; ``failed``: the draws
    (rows of ``draws``) whose refit failed, ``n_failed`` of them."""

    names: tuple[str, ...]
    samples: np.ndarray  # (n_ok, len(names))
    unit: str  # "trunk" (cluster bootstrap) or "point"
    seed: int
    draws: np.ndarray  # (n, n_units): the resampled unit indices of every draw
    failed: tuple[int, ...] = ()

    @property
    def n_failed(self) -> int:
        return len(self.failed)

    def column(self, name: str) -> np.ndarray:
        return self.samples[:, self.names.index(name)]

    def ci(self, level: float = CI_LEVEL) -> dict[str, tuple[float, float]]:
        return {n: percentile_interval(self.column(n), level) for n in self.names}

    def to_json(self) -> dict:
        return {"unit": self.unit, "seed": self.seed, "n": int(self.draws.shape[0]), "n_failed": self.n_failed,
                "failed": list(self.failed), "names": list(self.names), "samples": self.samples.tolist()}


def percentile_interval(values: np.ndarray, level: float = CI_LEVEL) -> tuple[float, float]:
    """The central ``level`` percentile interval; infinities (e.g. no crossing) count as extreme values."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return float("nan"), float("nan")
    q = 100 * (1 - level) / 2
    lo, hi = np.percentile(v, [q, 100 - q], method="inverted_cdf")  # no interpolation: inf stays inf
    return float(lo), float(hi)


def resampling_units(df: pd.DataFrame) -> tuple[str, list[np.ndarray]]:
    """The resampling units: rows grouped by trunk when the column exists, else single rows."""
    if TRUNK in df.columns:
        codes, _ = pd.factorize(df[TRUNK].astype(str), sort=True)
        return "trunk", [np.flatnonzero(codes == c) for c in range(codes.max() + 1)]
    return "point", [np.array([i]) for i in range(len(df))]


def _refit_chunk(problem: FitProblem, best: StartResult, options: FitOptions,
                 row_sets: list[np.ndarray]) -> list[np.ndarray | None]:
    return [try_refit(problem.subset(rows), best, options) for rows in row_sets]


def _refit_chunk_fixed(law: Law, df: pd.DataFrame, best: StartResult, options: FitOptions,
                       row_sets: list[np.ndarray], fixed: list[dict[str, float] | None]) -> list[np.ndarray | None]:
    """Refits where each draw fixes its own values (E drawn from the shared fit's bootstrap); a draw whose value is
    missing (its E refit failed) fails too."""
    return [None if f is None else try_refit(prepare(law, df, f, options)[0].subset(rows), best, options)
            for rows, f in zip(row_sets, fixed, strict=True)]


def bootstrap(law: Law, df: pd.DataFrame, result: FitResult, n: int = 1000, seed: int = 0,
              options: FitOptions | None = None, workers: int = 1,
              progress: Callable[[int], None] | None = None, *, problem: FitProblem | None = None,
              fixed_draws: list[dict[str, float] | None] | None = None) -> Bootstrap:
    """``n`` refits of ``result`` on resampled trunks (or points); ``progress(k)`` is told of every k finished.
    ``problem``: the one ``prepare`` built for this fit (law, df, result.fixed, options), if the caller has it.
    ``fixed_draws``: per draw, the fixed values it refits with instead of ``result.fixed`` (None: that draw
    fails), so that the uncertainty of a value fixed from another fit is carried into this one."""
    options = options or FitOptions()
    if problem is None:
        problem, _ = prepare(law, df, result.fixed, options)
    if fixed_draws is not None and len(fixed_draws) != n:
        raise ValueError(f"fixed_draws has {len(fixed_draws)} draws for a bootstrap of {n}")
    unit, units = resampling_units(df)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(units), size=(n, len(units)))
    row_sets = [np.concatenate([units[u] for u in d]) for d in draws]
    fixed = fixed_draws if fixed_draws is not None else [result.fixed] * n
    best = result.best
    chunk = max(1, min(50, n // (4 * max(workers, 1)) or 1))
    if fixed_draws is None:
        jobs = [(_refit_chunk, (problem, best, options, row_sets[i:i + chunk])) for i in range(0, n, chunk)]
    else:
        jobs = [(_refit_chunk_fixed, (law, df, best, options, row_sets[i:i + chunk], fixed[i:i + chunk]))
                for i in range(0, n, chunk)]
    thetas: list[np.ndarray | None] = []
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            futures = [pool.submit(f, *a) for f, a in jobs]
            for future in futures:
                thetas.extend(part := future.result())
                if progress:
                    progress(len(part))
    else:
        for f, a in jobs:
            thetas.extend(part := f(*a))
            if progress:
                progress(len(part))
    names = law.param_names
    rows, failed = [], []
    for i, t in enumerate(thetas):
        values = None if t is None else [user_params(problem, t, fixed[i])[k] for k in names]
        if values is None or not np.all(np.isfinite(values)):
            failed.append(i)
        else:
            rows.append(values)
    samples = np.array(rows, dtype=float).reshape(-1, len(names))
    return Bootstrap(names, samples, unit, seed, draws, tuple(failed))
