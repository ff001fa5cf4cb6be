"""Leave-future-out backtests: refit every form without the grid's largest budget, then without its largest size
(and without both), and predict the runs left out.

This is how a projection is checked before it is trusted (docs/laws.md, "The answer beyond one law"): each held-out run
is a projection the laws made beyond the data they were fitted on, at a known distance (log10 of the factor beyond the
fitted range, the worst column), and its signed log error (log predicted − log observed: positive means the law
predicted too high a loss) is what the answer's weights and calibrated bands are made of (fitting/bands.py). So is D*:
the truncated grid's D* against the full grid's, per pair of forms and size.

Only observed rows take part (a decay end predicted from a trunk curve is no run). A holdout the grid cannot afford
(fewer than two values of a column left) is skipped with the reason, a form that cannot be refitted there too, and
an analysis with no backtest at all says that its intervals do not cover law-form error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from upscale.fitting.curve_observations import is_predicted
from upscale.fitting.form_fits import FormFit, fit_forms
from upscale.fitting.laws import LOSS
from upscale.fitting.projection import FormPath, form_path, pair_dstar, tokens_grid

HOLDOUTS = ("budget", "size", "both")
TOKENS = {"scratch": ("D",), "upcycled": ("D1", "D2")}
SIZE = {"scratch": "N", "upcycled": "N1"}


@dataclass(frozen=True)
class Backtests:
    """Every held-out prediction (``points``: holdout, arm, form, size, tokens, observed, log_error, distance), what
    each holdout fitted and predicted (``runs``), what could not be run and why (``skipped``), and the refits
    themselves (``fits``: holdout → arm → form), for the D* backtest (``dstar_backtest``)."""

    points: pd.DataFrame
    runs: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    fits: dict[str, dict[str, dict[str, FormFit]]] = field(default_factory=dict)

    @property
    def ran(self) -> bool:
        return not self.points.empty


def held_out(kind: str, df: pd.DataFrame, holdout: str, top: Mapping[str, float]) -> np.ndarray:
    """Rows of ``df`` (table ``kind``) that ``holdout`` leaves out: at the largest budget of any token column, at
    the largest size, or either."""
    budget = np.zeros(len(df), dtype=bool)
    for c in TOKENS[kind]:
        budget |= df[c].to_numpy(dtype=float) >= top[c]
    size = df[SIZE[kind]].to_numpy(dtype=float) >= top[SIZE[kind]]
    return {"budget": budget, "size": size, "both": budget | size}[holdout]


def distance(columns: Mapping[str, np.ndarray], trained: Mapping[str, tuple[float, float]]) -> np.ndarray:
    """log10 of how many times each row lies beyond the trained range, the worst column (0 inside it)."""
    worst = np.ones(len(next(iter(columns.values()))))
    for c, v in columns.items():
        lo, hi = trained[c]
        worst = np.maximum(worst, np.maximum(v / hi, lo / v))
    return np.log10(worst)


def _affordable(kind: str, df: pd.DataFrame) -> str:
    """Why ``df`` cannot be fitted after a holdout ("" when it can): each column needs two values."""
    for c in (*TOKENS[kind], SIZE[kind]):
        if df[c].nunique() < 2:
            return f"the {kind} runs left have one value of {c}"
    return ""


def run_backtests(tables: Mapping[str, pd.DataFrame], full: Mapping[str, Mapping[str, FormFit]],
                  E: float) -> Backtests:
    """The three holdouts of ``tables`` ("scratch" and "upcycled": one upcycling group), each arm's forms refitted on
    what is left, warm-started at their whole-grid fits, with E held at the whole grid's ``E`` (the data's floor,
    which no holdout moves much and whose joint refit would cost most of the backtest); ``full``: the forms fitted
    on the whole grid (arm → form → fit)."""
    observed = {k: tables[k][~is_predicted(tables[k])].reset_index(drop=True) for k in ("scratch", "upcycled")}
    top = {c: float(observed[k][c].max()) for k in ("scratch", "upcycled") for c in (*TOKENS[k], SIZE[k])}
    rows: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    refits: dict[str, dict[str, dict[str, FormFit]]] = {}
    for holdout in HOLDOUTS:
        kept, left = {}, {}
        for kind in ("scratch", "upcycled"):
            mask = held_out(kind, observed[kind], holdout, top)
            kept[kind], left[kind] = observed[kind][~mask], observed[kind][mask]
        why = next((w for w in (_affordable(k, kept[k]) for k in kept) if w), "")
        if why:
            skipped.append({"holdout": holdout, "why": why})
            continue
        fits = {}
        for arm in ("scratch", "upcycled"):
            fits[arm], failed = fit_forms(arm, kept[arm], E, starts=full[arm])
            skipped.extend({"holdout": holdout, "arm": arm, "form": f, "why": w} for f, w in failed.items())
            if left[arm].empty:
                continue
            for name, ff in fits[arm].items():
                cols = {c: left[arm][c].to_numpy(dtype=float) for c in ff.form.law.columns}
                err = ff.log_predict(cols) - np.log(left[arm][LOSS].to_numpy(dtype=float))
                dist = distance(cols, ff.trained)
                for i in range(len(err)):
                    tokens = float(max(cols[c][i] for c in TOKENS[arm]))
                    rows.append({"holdout": holdout, "arm": arm, "form": name,
                                 "size": float(cols[SIZE[arm]][i]), "tokens": tokens,
                                 "observed": float(left[arm][LOSS].iloc[i]), "log_error": float(err[i]),
                                 "distance": float(dist[i])})
        below = max(float(kept[k][c].max()) for k in kept for c in TOKENS[k])
        beyond = max((float(left[k][c].max()) for k in left for c in TOKENS[k] if len(left[k])), default=below)
        runs.append({"holdout": holdout, "fitted_below": below, "predicted_up_to": beyond,
                     "held_out": {k: len(v) for k, v in left.items()}})
        refits[holdout] = fits
    return Backtests(pd.DataFrame(rows), runs, skipped, refits)


def dstar_backtest(backtests: Backtests, full: Mapping[str, Mapping[str, FormFit]], pairs: Sequence[tuple[str, str]],
                   n1s: Sequence[float], span: tuple[float, float]) -> list[dict[str, Any]]:
    """Per holdout, size and pair of forms (scratch, upcycled) fitted both ways: the truncated grid's D* against the
    whole grid's, over ``span``."""
    tokens = tokens_grid(span)
    needed = {"scratch": {s for s, _ in pairs}, "upcycled": {u for _, u in pairs}}

    def paths(fits: Mapping[str, Mapping[str, FormFit]], n1: float) -> dict[tuple[str, str], FormPath]:
        return {(arm, f): form_path(ff.form, ff.row(), n1, tokens) for arm, by_form in fits.items()
                for f, ff in by_form.items() if f in needed[arm]}

    out = []
    for n1 in n1s:
        whole = paths(full, n1)
        for holdout, truncated in backtests.fits.items():
            cut = paths(truncated, n1)
            for s, u in pairs:
                if ("scratch", s) not in cut or ("upcycled", u) not in cut:
                    continue
                a = pair_dstar(cut["scratch", s], cut["upcycled", u], tokens).dstar[0]
                b = pair_dstar(whole["scratch", s], whole["upcycled", u], tokens).dstar[0]
                ok = all(math.isfinite(v) and v > 0 for v in (a, b))
                out.append({"holdout": holdout, "n1": n1, "scratch": s, "upcycled": u, "truncated": a, "full": b,
                            "log10_ratio": float(np.log10(a / b)) if ok else None})
    return out
