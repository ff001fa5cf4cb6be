"""The fit report users script against (``upscale fit --json``), grouped fits, and reading a report back.

One report: ``{"law", "params", "objective", "converged", "n_points", "loo_rms", "ci", "problems"}`` (the fit's
health: fitting/health.py's checks, each a named problem with what to add) plus what makes it
reusable: ``trained`` (each column's min and max: where the law has data, so that D* is searched there and an answer
far from it is named an extrapolation), ``fixed``, ``record`` (fitter version, grid, tolerances, data hash) and,
after a bootstrap, the ``bootstrap`` samples, so that `upscale dstar` / `decide` can carry the uncertainty into D*
and the verdict. With ``by`` columns the table is split and each group gets its own report under ``"groups"``.

A LOO or bootstrap refit that fails is counted, never fatal: ``loo_failed`` (with ``loo_failed_rows``, 1-based,
and ``loo_note``) and ``bootstrap_failed`` (with ``bootstrap_note``) say how many, ``loo_rms`` is over the refits
that succeeded (null when more than a quarter failed), and the notes are among the ``warnings``. Only the fit
itself failing raises.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from upscale.fitting.bootstrap import Bootstrap, bootstrap
from upscale.fitting.compare import MAX_LOO_FAILED, leave_one_out
from upscale.fitting.curve_observations import is_predicted
from upscale.fitting.errors import FitError
from upscale.fitting.fit import FitOptions, fit_problem, prepare
from upscale.fitting.health import check_fit
from upscale.fitting.laws import LOSS, Law, get_law


@dataclass(frozen=True)
class FittedLaw:
    """A law with its fitted parameters and, when bootstrapped, parameter samples (rows aligned with names)."""

    law: Law
    params: dict[str, float]
    samples: np.ndarray | None = None  # (B, len(law.param_names))
    trained: dict[str, tuple[float, float]] | None = None  # each column's (min, max) in the fitted table

    def span(self, column: str) -> tuple[float, float] | None:
        """The trained range of ``column`` (None when the fit does not say: parameters typed in, an old report)."""
        return None if self.trained is None or column not in self.trained else self.trained[column]

    def sample_params(self) -> list[dict[str, float]]:
        if self.samples is None:
            return []
        return [dict(zip(self.law.param_names, row, strict=True)) for row in self.samples]


def finite_or_none(x: float) -> float | None:
    """A number for JSON: NaN and infinities (no crossing, a failed bound) become null."""
    return float(x) if np.isfinite(x) else None


def clean(x: Any) -> Any:
    """JSON-safe, recursively through dicts, lists and tuples: NaN and infinities become null (strict JSON has
    neither). What `upscale ... --json` prints and what the API stores."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [clean(v) for v in x]
    return x


def report(law: Law, df: pd.DataFrame, fixed: dict[str, float] | None = None, n_boot: int = 0, seed: int = 0,
           options: FitOptions | None = None, workers: int = 1, progress: Callable[[int], None] | None = None,
           fixed_draws: list[dict[str, float] | None] | None = None,
           loo_held_out: int | None = None) -> tuple[dict[str, Any], Bootstrap | None]:
    """Fit, LOO and (if ``n_boot``) bootstrap ``law`` on ``df``: the JSON report and the bootstrap.
    ``progress(k)`` is told of every k refits done, ``report_steps`` of them (bootstrap and LOO). ``fixed_draws``:
    the fixed values per bootstrap draw (bootstrap.py), when they come from another fit's bootstrap.
    ``loo_held_out``: leave out only a seeded sample of this many rows when there are more (`loo_sampled` says how
    many were)."""
    options = options or FitOptions()
    problem, table = prepare(law, df, fixed, options)  # built once: the fit, its LOO and its bootstrap share it
    result = fit_problem(law, problem, table, fixed, options)
    boot = (bootstrap(law, df, result, n_boot, seed, options, workers, progress, problem=problem,
                      fixed_draws=fixed_draws) if n_boot > 0 else None)
    loo = leave_one_out(problem, result.best, options, progress, table=table, columns=law.columns,
                        held_out=loo_held_out, seed=seed)
    boot_note = bootstrap_note(boot) if boot is not None else None
    out: dict[str, Any] = {
        "law": law.name,
        "params": result.params,
        "objective": result.objective,
        "converged": result.converged,
        "n_points": result.n_points,
        "trained": trained_ranges(law, table[~is_predicted(df)]),  # a predicted decay end is no trained point
        "loo_rms": loo.reported,
        "ci": {k: [finite_or_none(lo), finite_or_none(hi)] for k, (lo, hi) in boot.ci().items()
               if k not in result.fixed} if boot else {},
        "fixed": result.fixed,
        "warnings": [*result.warnings, *(n for n in (loo.note, boot_note) if n)],
        "record": result.to_json()["record"],
        "loo_failed": loo.failed,
        "loo_failed_rows": list(loo.failed_rows),
        "loo_note": loo.note,
        "loo_sampled": loo.sampled,
        "bootstrap_failed": boot.n_failed if boot is not None else 0,
        "bootstrap_note": boot_note,
    }
    out["problems"] = check_fit(law, out, table, where=(law.name, "fit"), min_loss=float(table[LOSS].min()))
    if boot is not None:
        out["bootstrap"] = boot.to_json()
    return out, boot


def trained_ranges(law: Law, df: pd.DataFrame) -> dict[str, list[float]]:
    """Each of the law's columns as [min, max] over ``df``'s rows."""
    return {c: [float(df[c].min()), float(df[c].max())] for c in law.columns}


def bootstrap_note(boot: Bootstrap) -> str | None:
    """What the bootstrap's failed refits mean for its intervals, None when none failed."""
    n = int(boot.draws.shape[0])
    if boot.n_failed == 0:
        return None
    head = f"{boot.n_failed} of {n} bootstrap refits did not converge"
    if boot.n_failed == n:
        return f"{head}: no interval is reported"
    tail = f"the intervals are over the other {n - boot.n_failed}"
    if boot.n_failed > MAX_LOO_FAILED * n:
        tail += " and likely too narrow (the resamples that failed are the ones the data pin down least)"
    return f"{head}: {tail}"


def report_steps(df: pd.DataFrame, n_boot: int, loo_held_out: int | None = None) -> int:
    """How many refits ``report`` tells its ``progress`` of: the bootstrap's and one LOO refit a row left out."""
    return n_boot + min(len(df), loo_held_out or len(df))


def group_keys(df: pd.DataFrame, by: list[str]) -> list[tuple[dict[str, Any], pd.DataFrame]]:
    """The table split by the ``by`` columns, groups in sorted order, each with its key."""
    missing = [c for c in by if c not in df.columns]
    if missing:
        have = ", ".join(map(str, df.columns))
        raise FitError(f"--by column(s) {', '.join(missing)} not in the table; it has {have}")
    out = []
    # dropna=False: a group whose key is empty (r of a method that takes none) is a group, not dropped rows.
    for key, part in df.groupby(by, sort=True, dropna=False):
        values = key if isinstance(key, tuple) else (key,)
        plain = {c: None if pd.isna(v) else (v.item() if hasattr(v, "item") else v)
                 for c, v in zip(by, values, strict=True)}
        out.append((plain, part.reset_index(drop=True)))
    return out


def grouped_report(law: Law, df: pd.DataFrame, by: list[str], fixed: dict[str, float] | None = None,
                   n_boot: int = 0, seed: int = 0, options: FitOptions | None = None, workers: int = 1,
                   progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """One report per group of ``by`` (e.g. method, r): how each parameter moves across groups."""
    groups = []
    for key, part in group_keys(df, by):
        try:
            rep, _ = report(law, part, fixed, n_boot, seed, options, workers, progress)
        except FitError as e:
            raise FitError(f"group {key}: {e}") from None
        groups.append({"group": key, **rep})
    return {"law": law.name, "by": by, "groups": groups}


def load_fit(path: str | Path) -> FittedLaw:
    """A law and its parameters (and bootstrap samples, if any) from an ``upscale fit --json`` file."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise FitError(f"fit file {str(p)!r} does not exist; write one with `upscale fit --json > FILE`") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FitError(f"fit file {str(p)!r} is not JSON ({e}); write it with `upscale fit --json`") from None
    return fitted_law(data, f"fit file {str(p)!r}")


def fitted_law(data: Any, source: str = "the fit report") -> FittedLaw:
    """A law and its parameters (and bootstrap samples, if any) from one fit report as JSON: a file's, a stored fit's
    (GET /fits) or an analysis's. ``source`` names it in errors."""
    if not isinstance(data, dict) or "law" not in data or "params" not in data:
        raise FitError(f"{source} has no 'law' and 'params'; write one fit with `upscale fit --json` (without --by)")
    law = get_law(data["law"])
    missing = [n for n in law.param_names if n not in data["params"]]
    if missing:
        raise FitError(f"{source} lacks parameter(s) {', '.join(missing)} of law {law.name!r}")
    params = {n: float(data["params"][n]) for n in law.param_names}
    samples = None
    boot = data.get("bootstrap")
    if boot and boot.get("samples"):
        names = boot["names"]
        arr = np.asarray(boot["samples"], dtype=float)
        samples = arr[:, [names.index(n) for n in law.param_names]]
    trained = data.get("trained")
    spans = {c: (float(trained[c][0]), float(trained[c][1])) for c in law.columns if c in trained} if trained else None
    return FittedLaw(law, params, samples, spans)
