"""Decay ends predicted from loss curves: what a WSD trunk's curve says about the decays nobody bought
(docs/laws.md, "Curves as observations").

A trunk's validation curve at constant LR passes every point where a decay could branch. The multi-power law
(fitting/curve_law.py) fitted to the trunk's curve and the decays observed from it predicts the end of a decay at
any of those points, so a grid point on an already-trained part of a trunk has a loss before its decay is trained.

Such a number is a prediction, not an observation, and is kept apart from observed decays everywhere: it carries how
far it can be trusted, measured rather than assumed. Each observed decay is predicted once more from a fit that does
not see it (its trunk's curve and that trunk's other decays, or, where it has none left, the trunk's curve with the
decay parameters of another trunk's fit); the root mean square of those held-out log errors is the predictions' sd.
With fewer than ``MIN_HELD_OUT`` held-out decays there is no measured error, and nothing is predicted.

A trunk without an observed decay takes its decay parameters (B, C, beta, gamma: how much a decay gains) from the
fitted trunk of its family with the most decay measurements; the caller passes one family at a time (trunks of one
kind of model, whose decays behave alike: dense, from-scratch MoE, one upcycled group), with LRs as multipliers of
each trunk's own peak so that the decay parameters are in one unit across the family.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from upscale.fitting.curve_law import DECAY_PARAMS, Curve, fit_curves, predict
from upscale.fitting.errors import FitError
from upscale.fitting.fit import FitOptions

MIN_HELD_OUT = 2  # held-out decays needed before a prediction's error counts as measured


@dataclass(frozen=True)
class Interior:
    """A planned decay on the trained part of a trunk, not observed: its row of the observation table (the columns of
    orchestrator/observations.py's, no loss) and its LR of every step from 1 to its end."""

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
    errors measure, those errors, and why a trunk or the whole family could not be predicted."""

    losses: np.ndarray
    sd: float
    held_out: tuple[HeldOut, ...]
    problems: tuple[str, ...]

    @property
    def usable(self) -> bool:
        return len(self.held_out) >= MIN_HELD_OUT and math.isfinite(self.sd)

    def to_json(self) -> dict:
        return {"sd": self.sd if math.isfinite(self.sd) else None, "n_held_out": len(self.held_out),
                "held_out": [{"trunk": h.trunk, "end_step": h.end_step, "observed": h.observed,
                              "predicted": h.predicted} for h in self.held_out],
                "problems": list(self.problems)}


def _fit(curve: Curve, decays: Sequence[Curve], donor: dict[str, float] | None,
         options: FitOptions) -> dict[str, float] | None:
    """The law's parameters for one trunk: all of them from its curve and decays, or its own L0, A, alpha with the
    donor's decay parameters when it has no decay; None when neither is possible or the fit fails."""
    try:
        if decays:
            return fit_curves([curve, *decays], options=options).params
        if donor is not None:
            return fit_curves([curve], fixed={k: donor[k] for k in DECAY_PARAMS}, options=options).params
    except FitError:
        return None
    return None


def _end(params: dict[str, float], lr: np.ndarray) -> float:
    return float(predict(params, Curve(lr, np.array([lr.size])))[0])


def predict_decay_ends(trunks: Sequence[TrunkCurves], wanted: Sequence[tuple[str, np.ndarray]],
                       options: FitOptions | None = None) -> CurvePredictions:
    """The end loss of each decay in ``wanted`` ((trunk id, LR of every step from 1 to the decay's end)), from the
    curves of ``trunks`` (one family), with the sd of log loss its held-out decays measure."""
    options = options or FitOptions(n_starts=4)
    by_id = {t.trunk: t for t in trunks}
    unknown = sorted({w for w, _ in wanted} - set(by_id))
    if unknown:
        raise FitError(f"no curve for trunk(s) {', '.join(unknown[:5])}: a decay end is predicted only from its "
                       f"own trunk's curve")
    problems: list[str] = []
    own = {t.trunk: _fit(t.curve, t.decays, None, options) for t in trunks if t.decays}
    for t, p in own.items():
        if p is None:
            problems.append(f"trunk {t}: the law did not fit its curve and decays")
    fitted = {t: p for t, p in own.items() if p is not None}

    def donor_for(exclude: str) -> dict[str, float] | None:
        others = [t for t in trunks if t.trunk in fitted and t.trunk != exclude]
        if not others:
            return None
        best = max(others, key=lambda t: (sum(d.steps.size for d in t.decays), -trunks.index(t)))
        return fitted[best.trunk]

    params = dict(fitted)
    for t in trunks:
        if t.trunk in params or t.decays:
            continue
        p = _fit(t.curve, (), donor_for(t.trunk), options)
        if p is None:
            problems.append(f"trunk {t.trunk}: no decay of its own and no other trunk's decay parameters to borrow")
        else:
            params[t.trunk] = p

    held: list[HeldOut] = []
    for t in trunks:
        for i, d in enumerate(t.decays):
            rest = t.decays[:i] + t.decays[i + 1:]
            p = _fit(t.curve, rest, None if rest else donor_for(t.trunk), options)
            if p is not None:
                held.append(HeldOut(t.trunk, int(d.lr.size), float(d.loss[-1]), _end(p, d.lr)))
    errors = np.array([h.log_error for h in held])
    sd = float(np.sqrt(np.mean(errors ** 2))) if errors.size else float("nan")
    if len(held) < MIN_HELD_OUT:
        problems.append(f"{len(held)} observed decay(s) could be held out (need {MIN_HELD_OUT}): the predictions' "
                        f"error is not measured, so none is made; observe another decay")
        return CurvePredictions(np.full(len(wanted), np.nan), sd, tuple(held), tuple(problems))
    losses = np.array([_end(params[w], lr) if w in params else np.nan for w, lr in wanted])
    return CurvePredictions(losses, sd, tuple(held), tuple(problems))
