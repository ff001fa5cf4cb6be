"""The shared E: the irreducible loss fitted jointly by the dense and from-scratch Chinchilla laws (the paper's
Sec. 5: it is the data's, not the architecture's), bootstrapped so that its uncertainty is carried on, and its health.

The analysis then fixes E in the from-scratch and upcycled fits. A fixed E would make their intervals (and D*'s) as
if E were known exactly; instead the joint fit is cluster-bootstrapped (trunks of each table resampled within that
table) and draw i of every later bootstrap refits with E at draw i's value (fitting/bootstrap.py ``fixed_draws``), so
D*'s interval carries E's uncertainty. The draws of the later bootstraps resample their own tables independently of
E's draw, which ignores the correlation through the from-scratch table and so errs wide, not narrow.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from upscale.fitting.bootstrap import percentile_interval, resampling_units
from upscale.fitting.dstar import intervals
from upscale.fitting.errors import FitError
from upscale.fitting.fit import (
    FitOptions,
    FitResult,
    fit_shared,
    shared_problem,
    split_shared,
    try_refit,
    user_params,
)
from upscale.fitting.health import DEFAULT, Problem, check_bounds, check_monotone, problem
from upscale.fitting.laws import get_law

SHARED_FIT = "shared E (dense + from scratch)"  # the fit's name in the record's problems


@dataclass(frozen=True)
class SharedE:
    """The joint E fit: E, why it was fixed (if it was) or what its fit warned of, the dense law's parameters of that
    fit, whether E was fitted (False: fixed at its low bound), fit.py's warnings (parameters out of range), and the
    bootstrap draws of E (NaN where a refit failed; empty without a bootstrap)."""

    E: float
    note: str
    dense_params: dict[str, float]
    fitted: bool = False
    warnings: tuple[str, ...] = ()
    samples: np.ndarray = field(default_factory=lambda: np.empty(0))

    def fixed_draws(self) -> list[dict[str, float] | None] | None:
        """Per bootstrap draw, the E later fits refit with (None where E's refit failed); None without draws."""
        if not self.samples.size:
            return None
        return [None if np.isnan(e) else {"E": float(e)} for e in self.samples]

    def to_json(self) -> dict:
        """E's bootstrap for the record: its 80% and 95% intervals and how many refits failed."""
        ok = self.samples[~np.isnan(self.samples)] if self.samples.size else self.samples
        return {"intervals": intervals(ok), "bootstrap": int(self.samples.size),
                "failed": int(np.isnan(self.samples).sum()) if self.samples.size else 0}


def _bootstrap_E(tables: dict[str, pd.DataFrame], result: FitResult, n: int, seed: int) -> np.ndarray:
    """E of ``n`` refits of the joint fit ``result``, each table's trunks (or points) resampled within it; NaN
    where one failed."""
    chin, options = get_law("chinchilla"), FitOptions()
    problem, _, _ = shared_problem({k: (chin, df) for k, df in tables.items()}, ("E",), {}, options)
    rng = np.random.default_rng(seed)
    offset, per_table = 0, []
    for df in tables.values():
        _, units = resampling_units(df)
        draws = rng.integers(0, len(units), size=(n, len(units)))
        per_table.append([np.concatenate([units[u] + offset for u in d]) for d in draws])
        offset += len(df)
    out = np.full(n, np.nan)
    for i in range(n):
        theta = try_refit(problem.subset(np.concatenate([rows[i] for rows in per_table])), result.best, options)
        if theta is not None:
            out[i] = user_params(problem, theta, {})["E"]
    return out


def fit_shared_E(dense: pd.DataFrame | None, scratch: pd.DataFrame | None, n_boot: int = 0,
                 seed: int = 0) -> SharedE:
    """E of the dense and from-scratch Chinchilla laws fitted jointly (or of whichever one the grid identifies),
    with the fit's warnings kept and, with ``n_boot``, its cluster bootstrap."""
    chin = get_law("chinchilla")
    low = chin.param("E").bounds[0]
    tables = {label: df for label, df in (("dense", dense), ("moe", scratch)) if df is not None}
    if not tables:
        return SharedE(low, f"E is not identified: neither the dense nor the from-scratch law can be fitted on this "
                            f"grid; fixed at {low:g}, the low end of its plausible range", {})
    try:
        result = fit_shared({k: (chin, df) for k, df in tables.items()}, shared=("E",))
    except FitError as e:  # a small grid may not pin E down: the fit drives it to 0; say so and carry on
        return SharedE(low, f"E is not identified by this grid ({e}); fixed at {low:g}, the low end of its plausible "
                            f"range", {})
    note = "" if len(tables) == 2 else f"E from the {'dense' if 'dense' in tables else 'from-scratch'} law alone"
    about_E = [w for w in result.warnings if w.startswith("E=")]
    if about_E:  # printed with E, so that a degenerate E is never shown as a clean number
        note = "; ".join([*([note] if note else []), *about_E, "the analysis's problems say what to add"])
    dense_params = split_shared(result, "dense", chin) if "dense" in tables else {}
    samples = _bootstrap_E(tables, result, n_boot, seed) if n_boot > 0 else np.empty(0)
    return SharedE(result.params["E"], note, dense_params, True, result.warnings, samples)


def _interval_problems(shared: SharedE, min_loss: float, floor: float, where: tuple[str, str]) -> list[Problem]:
    """E's 95% bootstrap interval reaching its floor (E driven to ~0 by some resamples), the smallest observed loss,
    or spanning more decades than health.py allows a scale: the data do not pin the irreducible loss."""
    ok = shared.samples[~np.isnan(shared.samples)] if shared.samples.size else shared.samples
    if not ok.size:
        return []
    lo, hi = percentile_interval(ok)
    reaches = [what for what, bad in ((f"its floor {floor:g} (E driven to ~0)", lo <= 1.1 * floor),
                                      (f"the smallest observed loss {min_loss:.3g}", hi >= min_loss),
                                      (f"over {DEFAULT.max_decades:g} decades", hi > lo * 10 ** DEFAULT.max_decades))
               if bad]
    if not reaches:
        return []
    return [problem(*where, "interval", f"E's 95% bootstrap interval [{lo:.3g}, {hi:.3g}] reaches "
                    f"{' and '.join(reaches)}: the data do not pin the irreducible loss", "longer runs (larger token "
                    "budgets) at every size, where the loss approaches its floor, and more trunks, so that every "
                    "resample pins E")]


def shared_problems(shared: SharedE, dense: pd.DataFrame | None, scratch: pd.DataFrame | None) -> list[Problem]:
    """The health of the shared E fit (fitting/health.py): E at 0 or above the smallest loss, the dense law's
    parameters at a bound or rising with D or N, E's bootstrap interval spanning decades, and every warning of
    ``fit_shared``; E fixed at its low bound because the grid could not pin it is a problem too."""
    chin = get_law("chinchilla")
    where = ("chinchilla", SHARED_FIT)
    losses = [df["loss"] for df in (dense, scratch) if df is not None and not df.empty]
    if not shared.fitted:
        if not losses:  # nothing was fitted: the identifiability problems say why
            return []
        return [problem(*where, "bound", shared.note, "longer runs (larger token budgets) at every size, where the "
                        "loss approaches its floor, so the data pin E")]
    params = {"E": shared.E, **shared.dense_params}
    free = [n for n in chin.param_names if n == "E" or (shared.dense_params and n in shared.dense_params)]
    min_loss = float(min(s.min() for s in losses))
    out = check_bounds(chin, params, free, where=where, min_loss=min_loss)
    for i, p in enumerate(out):  # the dense law's own parameters by their names in the shared fit
        if p["why"].split("=")[0] != "E":
            out[i] = {**p, "why": f"dense.{p['why']}"}
    if dense is not None and shared.dense_params:
        out += check_monotone(chin, shared.dense_params, dense, where=where)
    out += _interval_problems(shared, min_loss, chin.param("E").bounds[0], where)
    for w in shared.warnings:  # fit_shared's own warnings land here, never dropped
        if not any(w in p["why"] for p in out):
            out.append(problem(*where, "bound", w, "more values of D and N, over a wider range, so the data pin it"))
    return out
