"""Decay ends predicted from loss curves: what a WSD trunk's curve says about the decays nobody bought
(docs/laws.md, "Curves as observations").

A trunk's validation curve at constant LR passes every point where a decay could branch. The multi-power law
(fitting/curve_law.py) fitted to the trunk's curve and the decays observed from it predicts the end of a decay at
any of those points, so a grid point on an already-trained part of a trunk has a loss before its decay is trained.

Such a number is a prediction, not an observation, and is kept apart from observed decays everywhere: it carries how
far it can be trusted, measured rather than assumed. Each observed decay is predicted once more from a fit that does
not see it (its trunk's curve and that trunk's other decays, with the trunk's own decay parameters, another trunk's
where it has no decay left, or the family's pooled ones: see below); the root mean square of those held-out log
errors is the predictions' sd. With fewer than ``MIN_HELD_OUT`` held-out decays there is no measured error, and
nothing is predicted.

The caller passes one family at a time (trunks of one kind of model, whose decays behave alike: dense, from-scratch
MoE, one upcycled group), with LRs as multipliers of each trunk's own peak so that the decay parameters (B, C, beta,
gamma: how much a decay gains) are in one unit across the family. Those parameters are set one of two ways, and the
family uses the one whose held-out decays err less: each trunk's own (fitted to its decays; a trunk with none
borrows the family's trunk with the most decay measurements), or pooled (the median of the family's other trunks'
own fits, so that two or three noisy decays of one trunk do not set them alone; a trunk with no decay borrows as in
the own way, since nothing would check a median that no single trunk's fit shares). The sd then scores that choice on
decays it was not made on (`_choose`), so picking the better of two errors does not make the error look smaller.

``predicted_decays`` turns the trunks of every family into rows of the analysis tables (``source`` "predicted", the
trunk id of the observed branches of that trunk, so that the cluster bootstrap resamples a trunk's predicted and
observed rows together: their correlation within the trunk is handled as the branches' is). The analysis weights
each by ``prediction_weight`` (fitting/analysis.py).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from upscale.fitting.curve_law import DECAY_PARAMS, Curve, fit_curves, predict
from upscale.fitting.errors import FitError
from upscale.fitting.fit import FitOptions
from upscale.fitting.laws import LOSS, TRUNK

MIN_HELD_OUT = 2  # held-out decays needed before a prediction's error counts as measured
SOURCE = "source"  # where a row's loss comes from in an analysis with curves: OBSERVED or PREDICTED
OBSERVED, PREDICTED = "observed", "predicted"
SD_PRED = "sd_pred"  # a predicted row's sd of log loss: its family's held-out RMS log error


@dataclass(frozen=True)
class Interior:
    """A decay on the trained part of a trunk with no observation (planned, or between two of the grid's budgets):
    its row of the observation table (the columns of orchestrator/observations.py's, no loss) and its LR of every
    step from 1 to its end."""

    row: Mapping[str, object]
    lr: np.ndarray


@dataclass(frozen=True)
class TrunkCurves:
    """One trunk's curve (its LR of every step from 1, warmup included, and its validation losses) and the decays
    observed from it, each with its whole schedule from step 1 and the losses measured along the decay; a decay's
    last measurement is its end, the observed loss. ``table`` is the analysis table its decays belong to (dense,
    scratch, upcycled), ``family`` the trunks whose decays behave alike (see the module docstring) and ``interior``
    the planned decays on its trained part that nobody observed yet."""

    trunk: str
    curve: Curve
    decays: tuple[Curve, ...] = ()
    table: str = ""
    family: str = ""
    interior: tuple[Interior, ...] = ()

    def __post_init__(self) -> None:
        for d in (self.curve, *self.decays):
            if d.loss is None:
                raise FitError(f"trunk {self.trunk}: every curve needs its measured losses")
        for d in self.decays:
            if d.steps[-1] != d.lr.size:
                raise FitError(f"trunk {self.trunk}: a decay's last measurement (step {d.steps[-1]}) must be its end "
                               f"(step {d.lr.size}): the end loss is what a prediction is scored against")


@dataclass(frozen=True)
class HeldOut:
    """One observed decay end predicted by a fit that did not see it."""

    trunk: str
    end_step: int
    observed: float
    predicted: float

    @property
    def log_error(self) -> float:
        return math.log(self.predicted / self.observed)


@dataclass(frozen=True)
class CurvePredictions:
    """Predicted decay ends (one per request, NaN where its trunk has no fit), the sd of log loss their held-out
    errors measure, those errors, why a trunk or the whole family could not be predicted, whose decay parameters
    the predictions use (``pooling``: "own" per trunk, or "pooled" over the family) and the held-out RMS log error
    of each way that was tried (``held_out_rms``, on the decays both could predict)."""

    losses: np.ndarray
    sd: float
    held_out: tuple[HeldOut, ...]
    problems: tuple[str, ...]
    pooling: str = "own"
    held_out_rms: Mapping[str, float] = field(default_factory=dict)

    @property
    def usable(self) -> bool:
        return len(self.held_out) >= MIN_HELD_OUT and math.isfinite(self.sd)

    def to_json(self) -> dict:
        return {"sd": self.sd if math.isfinite(self.sd) else None, "pooling": self.pooling,
                "held_out_rms": dict(self.held_out_rms), "n_held_out": len(self.held_out),
                "held_out": [{"trunk": h.trunk, "end_step": h.end_step, "observed": h.observed,
                              "predicted": h.predicted} for h in self.held_out],
                "problems": list(self.problems)}


def _fit(curve: Curve, decays: Sequence[Curve], fixed: dict[str, float] | None, options: FitOptions,
         memo: dict[str, dict[str, float] | None]) -> dict[str, float] | None:
    """The law's parameters for one trunk from its curve and decays, with its decay parameters ``fixed`` (another
    trunk's, or pooled) or, when None, fitted too; None when the fit is not possible or fails. ``memo`` keeps fits
    by their data, so the same fit is run once and a caller that predicts again after one trunk changed refits only
    what the change moved (a fit is deterministic in its data, so a kept one is the one a refit would give)."""
    fixed = {k: fixed[k] for k in DECAY_PARAMS} if fixed is not None else None
    h = hashlib.sha256(repr((sorted(fixed.items()) if fixed else None, options)).encode())
    for c in (curve, *decays):
        for a in (c.lr, c.steps, c.loss):
            h.update(np.ascontiguousarray(a, dtype=float).tobytes())
        h.update(b"|")
    key = h.hexdigest()
    if key not in memo:
        params = None
        if decays or fixed is not None:
            try:
                params = fit_curves([curve, *decays], fixed=fixed, options=options).params
            except FitError:
                params = None
        memo[key] = params
    return memo[key]


def _end(params: dict[str, float], lr: np.ndarray) -> float:
    return float(predict(params, Curve(lr, np.array([lr.size])))[0])


def _rms(errors: Sequence[float]) -> float:
    return float(np.sqrt(np.mean(np.square(errors)))) if len(errors) else float("nan")


@dataclass(frozen=True)
class _Mode:
    """One way of setting a trunk's decay parameters: its parameters for prediction (by trunk) and its held-out
    decays (by trunk and index of the decay)."""

    params: dict[str, dict[str, float]]
    held: dict[tuple[str, int], HeldOut]


def _donor(trunks: Sequence[TrunkCurves], fitted: dict[str, dict[str, float]], exclude: str) -> dict[str, float] | None:
    """The fitted parameters of the family's trunk with the most decay measurements, other than ``exclude``."""
    others = [t for t in trunks if t.trunk in fitted and t.trunk != exclude]
    if not others:
        return None
    best = max(others, key=lambda t: (sum(d.steps.size for d in t.decays), -trunks.index(t)))
    return fitted[best.trunk]


def _own_mode(trunks: Sequence[TrunkCurves], fitted: dict[str, dict[str, float]], options: FitOptions,
              memo: dict, problems: list[str]) -> _Mode:
    """Each trunk's decay parameters fitted to its own decays; a trunk with none borrows those of the trunk of its
    family with the most decay measurements."""
    params = dict(fitted)
    for t in trunks:
        if t.trunk in params or t.decays:
            continue
        p = _fit(t.curve, (), _donor(trunks, fitted, t.trunk), options, memo)
        if p is None:
            problems.append(f"trunk {t.trunk}: no decay of its own and no other trunk's decay parameters to borrow")
        else:
            params[t.trunk] = p
    held = {}
    for t in trunks:
        for i, d in enumerate(t.decays):
            rest = t.decays[:i] + t.decays[i + 1:]
            p = _fit(t.curve, rest, None if rest else _donor(trunks, fitted, t.trunk), options, memo)
            if p is not None:
                held[t.trunk, i] = HeldOut(t.trunk, int(d.lr.size), float(d.loss[-1]), _end(p, d.lr))
    return _Mode(params, held)


def _pooled_mode(trunks: Sequence[TrunkCurves], fitted: dict[str, dict[str, float]], options: FitOptions,
                 memo: dict, problems: list[str]) -> _Mode | None:
    """Each trunk's decay parameters fixed at the median of its family's other fitted trunks' own (its L0, A, alpha
    still fitted to its curve and decays); None with fewer than two fitted trunks. The median never sees the trunk's
    own decays, so its held-out decays are held out of the pooled parameters too. A trunk with no decay of its own
    borrows as in the own way: its prediction would rest on the median alone, which no held-out decay checks, and a
    median taken parameter by parameter over sets that explain the same decays differently (B, C, beta, gamma trade
    off) can describe a decay none of them does."""
    if len(fitted) < 2:
        return None

    def pooled_for(exclude: str) -> dict[str, float]:
        others = [p for t, p in fitted.items() if t != exclude]
        return {k: float(np.median([p[k] for p in others])) for k in DECAY_PARAMS}

    params, held = {}, {}
    for t in trunks:
        fixed = pooled_for(t.trunk) if t.decays else _donor(trunks, fitted, t.trunk)
        p = _fit(t.curve, t.decays, fixed, options, memo)
        if p is None:
            problems.append(f"trunk {t.trunk}: the law did not fit its curve with its family's pooled decay "
                            f"parameters")
        else:
            params[t.trunk] = p
        for i, d in enumerate(t.decays):
            q = _fit(t.curve, t.decays[:i] + t.decays[i + 1:], fixed, options, memo)
            if q is not None:
                held[t.trunk, i] = HeldOut(t.trunk, int(d.lr.size), float(d.loss[-1]), _end(q, d.lr))
    return _Mode(params, held)


def _choose(own: _Mode, pooled: _Mode | None) -> tuple[str, _Mode, list[HeldOut], dict[str, float]]:
    """The mode whose held-out decays err less, the held-out decays that measure that choice honestly, and each
    mode's held-out RMS. A choice by the smaller of two errors is optimistic when scored on the decays it was made
    on, so each decay is scored with the mode that the *other* held-out decays favour (a nested choice)."""
    keys = [k for k in own.held if pooled is not None and k in pooled.held]
    if pooled is None or len(keys) < MIN_HELD_OUT:
        return "own", own, list(own.held.values()), {"own": _rms([h.log_error for h in own.held.values()])}
    e_own = np.array([own.held[k].log_error for k in keys])
    e_pool = np.array([pooled.held[k].log_error for k in keys])
    nested = []
    for j, k in enumerate(keys):
        rest = np.arange(len(keys)) != j
        nested.append(pooled.held[k] if _rms(e_pool[rest]) < _rms(e_own[rest]) else own.held[k])
    rms = {"own": _rms(e_own), "pooled": _rms(e_pool)}
    return ("pooled", pooled, nested, rms) if rms["pooled"] < rms["own"] else ("own", own, nested, rms)


def predict_decay_ends(trunks: Sequence[TrunkCurves], wanted: Sequence[tuple[str, np.ndarray]],
                       options: FitOptions | None = None,
                       memo: dict[str, dict[str, float] | None] | None = None) -> CurvePredictions:
    """The end loss of each decay in ``wanted`` ((trunk id, LR of every step from 1 to the decay's end)), from the
    curves of ``trunks`` (one family), with the sd of log loss its held-out decays measure. The decay parameters
    are each trunk's own or pooled over the family, whichever predicts the held-out decays better (`_choose`).
    ``memo``: the per-trunk fits of earlier calls (see `_fit`), for a caller that predicts again as curves arrive."""
    options = options or FitOptions(n_starts=4)
    memo = memo if memo is not None else {}  # within one call too: the two ways share fits (in a family of two
    # trunks the pooled decay parameters are the borrowed donor's)
    by_id = {t.trunk: t for t in trunks}
    unknown = sorted({w for w, _ in wanted} - set(by_id))
    if unknown:
        raise FitError(f"no curve for trunk(s) {', '.join(unknown[:5])}: a decay end is predicted only from its "
                       f"own trunk's curve")
    problems: list[str] = []
    own = {t.trunk: _fit(t.curve, t.decays, None, options, memo) for t in trunks if t.decays}
    for t, p in own.items():
        if p is None:
            problems.append(f"trunk {t}: the law did not fit its curve and decays")
    fitted = {t: p for t, p in own.items() if p is not None}
    pooled_problems: list[str] = []
    own_mode = _own_mode(trunks, fitted, options, memo, problems)
    pooling, mode, held, rms = _choose(own_mode, _pooled_mode(trunks, fitted, options, memo, pooled_problems))
    if pooling == "pooled":
        problems += pooled_problems
    sd = _rms([h.log_error for h in held])
    if len(held) < MIN_HELD_OUT:
        problems.append(f"{len(held)} observed decay(s) could be held out (need {MIN_HELD_OUT}): the predictions' "
                        f"error is not measured, so none is made; observe another decay")
        return CurvePredictions(np.full(len(wanted), np.nan), sd, tuple(held), tuple(problems), pooling, rms)
    losses = np.array([_end(mode.params[w], lr) if w in mode.params else np.nan for w, lr in wanted])
    return CurvePredictions(losses, sd, tuple(held), tuple(problems), pooling, rms)


def is_predicted(df: pd.DataFrame) -> np.ndarray:
    """Which rows of a table are decay ends predicted from curves (the rest were observed)."""
    return (df[SOURCE] == PREDICTED).to_numpy() if SOURCE in df.columns else np.zeros(len(df), dtype=bool)


def prediction_weight(point_sd: float, sd_pred: float | np.ndarray) -> float | np.ndarray:
    """A predicted decay end's weight in a fit where an observed one counts 1: σ² / (σ² + sd_pred²), σ the per-point
    noise of the observed ends (docs/laws.md, "Curves as observations", says why this form)."""
    return point_sd ** 2 / (point_sd ** 2 + np.asarray(sd_pred, dtype=float) ** 2)


@dataclass(frozen=True)
class PredictedDecays:
    """The decay ends the trunks' curves predict, as rows of the analysis tables (each table's columns, ``loss`` the
    prediction, ``source`` "predicted", ``trunk``, ``sd_pred``), and per family what they rest on (its table, trunks,
    held-out errors, sd, problems, how many rows it gave; ``why`` when it gave none)."""

    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    families: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def n_rows(self) -> int:
        return sum(len(t) for t in self.tables.values())

    def to_json(self) -> dict[str, Any]:
        """Strict JSON: a missing value (NaN, a nullable column's NA) is null, numbers are plain and exact."""
        return {"families": self.families,
                "rows": {k: t.astype(object).where(t.notna(), None).to_dict(orient="records")
                         for k, t in self.tables.items() if len(t)}}


def _family_rows(family: str, trunks: Sequence[TrunkCurves],
                 options: FitOptions | None) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
    tables = sorted({t.table for t in trunks})
    if len(tables) != 1 or not tables[0]:
        raise FitError(f"family {family!r}: its trunks name the table(s) {tables}; a family's trunks belong to one "
                       f"analysis table (dense, scratch or upcycled)")
    wanted = [(t, i) for t in trunks for i in t.interior]
    report: dict[str, Any] = {"table": tables[0], "trunks": [t.trunk for t in trunks], "n_predicted": 0}
    if not wanted:
        return tables[0], [], {**report, "why": "no decay to predict on its trunks' trained parts (every "
                                                "planned one is observed, none lies between two budgets)"}
    got = predict_decay_ends(trunks, [(t.trunk, i.lr) for t, i in wanted], options)
    report |= got.to_json()
    if not got.usable:
        return tables[0], [], {**report, "why": "; ".join(got.problems)}
    rows = [{**i.row, LOSS: float(loss), TRUNK: t.trunk, SOURCE: PREDICTED, SD_PRED: got.sd}
            for (t, i), loss in zip(wanted, got.losses, strict=True) if math.isfinite(loss)]
    return tables[0], rows, {**report, "n_predicted": len(rows)}


def trunks_hash(trunks: Sequence[TrunkCurves]) -> str:
    """sha256 of everything the predictions read from ``trunks`` (curves, decays, schedules, the rows to predict):
    equal curves, equal predictions, so an analysis's inputs hash can stand on the curves without predicting."""
    h = hashlib.sha256()
    for t in trunks:
        h.update(json.dumps([t.trunk, t.table, t.family, [dict(i.row) for i in t.interior]], sort_keys=True,
                            default=str).encode())
        arrays = [a for c in (t.curve, *t.decays) for a in (c.lr, c.steps, c.loss)] + [i.lr for i in t.interior]
        for a in arrays:
            h.update(np.ascontiguousarray(a, dtype=float).tobytes())
    return h.hexdigest()


def predicted_decays(trunks: Sequence[TrunkCurves], options: FitOptions | None = None) -> PredictedDecays:
    """The interior decays of every family of ``trunks`` (``family``, else its ``table``) predicted from its curves:
    one DataFrame per table. A family whose predictions are not usable gives no rows, and its report says why."""
    by_family: dict[str, list[TrunkCurves]] = {}
    for t in trunks:
        by_family.setdefault(t.family or t.table, []).append(t)
    rows: dict[str, list[dict[str, Any]]] = {}
    families = {}
    for name, members in by_family.items():
        table, found, families[name] = _family_rows(name, members, options)
        rows.setdefault(table, []).extend(found)
    return PredictedDecays({k: pd.DataFrame(v) for k, v in rows.items() if v}, families)
