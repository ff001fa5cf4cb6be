"""From backtests to trust: the forms' weights, and loss bands calibrated for how far a projection reaches.

Weights (pseudo-BMA+, Yao et al. 2018): each form's held-out runs are scored by a Gaussian log density of their
log errors (one scale per arm, pooled over its forms), and the weights are the softmax of the summed scores,
averaged over Bayesian-bootstrap reweightings of the held-out runs, which keeps one lucky run from handing a form
all the weight. A form is weighed by what it predicted, never by how well it fits the runs it was fitted to; a form
that could not be refitted in every holdout gets none.

Bands (split conformal on normalised log residuals): the stacked prediction (the weights' mean of the forms' log
losses) of every held-out run has a residual r at a distance d (decades beyond the fitted range). Each arm's error
scale grows with distance as s(d) = sqrt(σ0² + (c·d)²), σ0 the in-range scatter and c the growth the backtests
show; the scores |r| / s(d) of both arms are pooled, and the band half-width in log loss at level p and distance d
is q_p·s(d), q_p the ⌈(n+1)p⌉-th smallest of the n scores (infinite when n is too small for p). Where the held-out
runs are exchangeable with the projection, the band covers it with probability at least p; beyond the distances the
backtests reached, the linear growth of s(d) is an assumption, which the answer states as its extrapolation.
A residual carries its run's point noise and D* is where mean losses cross, so the band D* reads has that noise
taken out of s(d) in quadrature (``half_width``'s ``noise``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy.special import softmax
from scipy.stats import norm

from upscale.fitting.backtest import Backtests
from upscale.fitting.form_fits import FormFit
from upscale.fitting.forms import ARMS, FORMS, PRIMARY

LEVELS = (0.8, 0.95)
_DRAWS = 1000  # Bayesian-bootstrap reweightings for the weights
_FLOOR = 1e-4  # no scale below this (log loss): a grid fitted exactly still has float noise


def _key(level: float) -> str:
    return str(round(level * 100))


@dataclass(frozen=True)
class Calibration:
    """The forms' weights per arm, each arm's error scale (σ0, c), the pooled conformal quantiles per level and how
    many scores they rest on; ``calibrated`` False when no backtest ran (the bands are then the in-range scatter
    alone and cover no law-form error: the answer says so)."""

    weights: dict[str, dict[str, float]]
    sigma0: dict[str, float]
    growth: dict[str, float]
    quantiles: dict[str, float]
    n_scores: int
    calibrated: bool

    def half_width(self, arm: str, d: np.ndarray | float, level: float, noise: float = 0.0) -> np.ndarray:
        """The band's half-width in log loss at distance ``d`` (decades beyond the data) and ``level``, for the mean
        loss the arm's law stands for: the runs' own point noise ``noise`` (an SD in log loss), which every
        held-out residual carries and a mean loss does not, is taken out of the scale in quadrature."""
        d = np.asarray(d, dtype=float)
        scale2 = self.sigma0[arm] ** 2 + (self.growth[arm] * d) ** 2
        return self.quantiles[_key(level)] * np.sqrt(np.maximum(scale2 - noise ** 2, _FLOOR ** 2))

    def to_json(self) -> dict[str, Any]:
        return {"weights": self.weights, "sigma0": self.sigma0, "growth_per_decade": self.growth,
                "quantiles": {k: (v if math.isfinite(v) else None) for k, v in self.quantiles.items()},
                "n_scores": self.n_scores, "calibrated": self.calibrated}


def _by_run(points: pd.DataFrame, values: str | list[str]) -> pd.DataFrame:
    """Held-out points as one row per run (holdout, size, tokens, observed loss) and a column per form."""
    return points.pivot_table(index=["holdout", "size", "tokens", "observed"], columns="form", values=values)


def form_weights(points: pd.DataFrame, arm: str, available: list[str], seed: int = 0) -> dict[str, float]:
    """Pseudo-BMA+ weights of the ``available`` forms of ``arm`` from their held-out log errors."""
    mine = points[points["arm"] == arm]
    table = _by_run(mine, "log_error")
    complete = [f for f in available if f in table.columns and table[f].notna().all()]
    if not complete or table.empty:
        return {}
    errors = table[complete].to_numpy(dtype=float)  # (runs, forms)
    sigma = max(float(np.sqrt(np.mean(errors ** 2))), _FLOOR)
    lpd = -0.5 * (errors / sigma) ** 2 - math.log(sigma) - 0.5 * math.log(2 * math.pi)
    n = lpd.shape[0]
    alpha = np.random.default_rng(seed).dirichlet(np.ones(n), size=_DRAWS)  # (draws, runs)
    w = softmax(n * alpha @ lpd, axis=1).mean(axis=0)
    return {f: float(v) for f, v in zip(complete, w, strict=True)}


def stacked(weights: Mapping[str, float], predictions: Mapping[str, np.ndarray]) -> np.ndarray:
    """The weights' mean of the forms' log predictions (forms without weight left out)."""
    return sum(w * np.asarray(predictions[f]) for f, w in weights.items() if w > 0)


def calibrate(backtests: Backtests, full: Mapping[str, Mapping[str, FormFit]], seed: int = 0) -> Calibration:
    """Weights and bands from ``backtests``; ``full``: the forms fitted on the whole grid (their in-range
    scatter sets σ0)."""
    weights, sigma0, residuals = {}, {}, {}
    for arm in ARMS:
        fitted = [f.name for f in FORMS[arm] if f.name in full[arm]]
        w = form_weights(backtests.points, arm, fitted, seed) if backtests.ran else {}
        if not w:  # no backtest: the paper's form alone, as the analysis always had it
            w = {PRIMARY[arm]: 1.0} if PRIMARY[arm] in full[arm] else {fitted[0]: 1.0} if fitted else {}
        weights[arm] = w
        sigma0[arm] = max(math.sqrt(sum(v * full[arm][f].rms ** 2 for f, v in w.items())), _FLOOR) if w else _FLOOR
        if backtests.ran:
            mine = backtests.points[(backtests.points["arm"] == arm) & backtests.points["form"].isin(list(w))]
            table = _by_run(mine, ["log_error", "distance"])
            if not table.empty:
                r = stacked(w, {f: table["log_error"][f].to_numpy() for f in w})
                d = table["distance"][next(iter(w))].to_numpy()
                residuals[arm] = (np.asarray(r, dtype=float), d)
    growth = {arm: _growth(*residuals[arm], sigma0[arm]) if arm in residuals else math.nan for arm in ARMS}
    known = [g for g in growth.values() if math.isfinite(g)]
    pooled = float(np.mean(known)) if known else 0.0
    growth = {arm: g if math.isfinite(g) else pooled for arm, g in growth.items()}
    scores = np.concatenate([np.abs(r) / np.sqrt(sigma0[a] ** 2 + (growth[a] * d) ** 2)
                             for a, (r, d) in residuals.items()]) if residuals else np.empty(0)
    quantiles = {_key(p): _conformal(scores, p) if scores.size else _gaussian(p) for p in LEVELS}
    return Calibration(weights, sigma0, growth, quantiles, int(scores.size), bool(scores.size))


def _growth(r: np.ndarray, d: np.ndarray, sigma0: float) -> float:
    """c in s(d) = sqrt(σ0² + (c·d)²): the RMS, over held-out runs beyond the data, of the error above the in-range
    scatter per decade of distance (NaN without such runs)."""
    far = d > 1e-9
    if not far.any():
        return math.nan
    return float(np.sqrt(np.mean(np.maximum(r[far] ** 2 - sigma0 ** 2, 0.0) / d[far] ** 2)))


def _conformal(scores: np.ndarray, level: float) -> float:
    """The split-conformal quantile: the ⌈(n+1)·level⌉-th smallest score, inf when that exceeds n."""
    k = math.ceil((scores.size + 1) * level)
    return float(np.sort(scores)[k - 1]) if k <= scores.size else math.inf


def _gaussian(level: float) -> float:
    """Without backtests, the band is the in-range scatter at a normal quantile (no law-form error in it)."""
    return float(norm.ppf(0.5 + level / 2))


def _percent(x: float) -> str:
    return f"{math.expm1(x):+.1%}"


def backtest_record(backtests: Backtests, calibration: Calibration, dstar: list[dict[str, Any]]) -> dict[str, Any]:
    """The backtests as the record keeps them: per holdout, what was fitted and predicted, the stacked and each
    form's log errors (min, max, RMS) per arm; every held-out point; the D* backtest of the weighed pairs
    (``dstar``); what was skipped; and ``line``, the sentence a researcher reads first."""
    runs = []
    pts = backtests.points
    for run in backtests.runs:
        errors: dict[str, Any] = {}
        for arm in ARMS:
            mine = pts[(pts["holdout"] == run["holdout"]) & (pts["arm"] == arm)] if backtests.ran else pts
            if mine.empty:
                continue
            per_form = {f: [float(g.min()), float(g.max()), float(np.sqrt(np.mean(g ** 2)))]
                        for f, g in mine.groupby("form")["log_error"]}
            w = {f: v for f, v in calibration.weights[arm].items() if f in per_form}
            table = _by_run(mine, "log_error")
            total = sum(w.values())
            r = stacked({f: v / total for f, v in w.items()}, {f: table[f].to_numpy() for f in w}) if total else None
            errors[arm] = {"forms": per_form,
                           "stacked": None if r is None else [float(np.min(r)), float(np.max(r)),
                                                                float(np.sqrt(np.mean(np.square(r))))]}
        runs.append({**run, "errors": errors})
    return {"ran": backtests.ran, "runs": runs, "points": pts.to_dict("records") if backtests.ran else [],
            "dstar": dstar, "skipped": backtests.skipped, "line": backtest_line(runs),
            "note": "" if backtests.ran else "no backtest could be run on this grid "
                                              f"({'; '.join(s['why'] for s in backtests.skipped) or 'no runs'}): "
                                              "the intervals cover parameter noise only, not law-form error"}


def backtest_line(runs: list[dict[str, Any]]) -> str:
    """'fitted below 1.05e+06 tokens, the laws predicted the 4.19e+06-token runs with errors from -1.2% to +0.4%' for
    the largest-budget holdout (the one a D* projection is most like); '' when it did not run."""
    run = next((r for r in runs if r["holdout"] == "budget"), None)
    if run is None:
        return ""
    spans = [e["stacked"] for e in run["errors"].values() if e.get("stacked")]
    if not spans:
        return ""
    lo, hi = min(s[0] for s in spans), max(s[1] for s in spans)
    return (f"fitted below {run['fitted_below']:.3g} tokens, the laws predicted the {run['predicted_up_to']:.3g}-token "
            f"runs with errors from {_percent(lo)} to {_percent(hi)}")
