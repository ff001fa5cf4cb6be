"""Predictive intervals for one observation from an analysis record: what the prediction ledger writes down before a
segment trains (control/ledger.py), so that the observation can later say whether the analysis deserves trust.

An interval for a *new observation* must hold two things: how unsure the fit is of the law (the spread of the
prediction over the fit's cluster-bootstrap refits) and how far one observation lands from the law (noise). The
noise is the fit's leave-one-out RMS, read as a relative error at the prediction: it is how far a held-out point
of the measured grid landed from its prediction, so it is the out-of-sample error the analysis itself measured.
Both are combined in log loss (the fitter's residuals and the synthetic noise are multiplicative):
sd² = Var_boot(log L̂) + (loo_rms / L̂)². On the grid this counts the parameter uncertainty a little twice (LOO
already holds some), which errs wide when points barely outnumber parameters; off the grid the bootstrap term grows
as the extrapolation does. Parameter spread alone would be far too narrow: on a measured grid the refits barely
move while every observation carries its noise. docs/laws.md "The prediction ledger".

Only the laws D* is built from are predicted: the from-scratch MoE law and each upcycled group's joint law. The
analysis keeps the dense law's parameters without a bootstrap or LOO, so dense observations get no interval.
Pure numerics, like the rest of fitting/.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from upscale.fitting.groups import GROUP_COLUMNS, group_label
from upscale.fitting.summary import FittedLaw, fitted_law


@dataclass(frozen=True)
class Prediction:
    """A predicted loss with the log-scale spreads its intervals come from."""

    law: str  # which fit of the analysis: "from-scratch" or "upcycled <group label>"
    loss: float  # the fitted law's loss at the point
    sigma_fit: float  # sd of log L̂ over the bootstrap refits
    sigma_noise: float  # the fit's observation noise in log loss

    @property
    def sigma(self) -> float:
        return float(np.hypot(self.sigma_fit, self.sigma_noise))

    def interval(self, z: float) -> tuple[float, float]:
        """The central interval of a new observation at the normal quantile ``z`` (Z80, Z95), in loss units."""
        return self.loss * float(np.exp(-z * self.sigma)), self.loss * float(np.exp(z * self.sigma))


def predict_observation(record: dict[str, Any], observation: dict[str, Any]) -> Prediction | None:
    """The prediction for a planned observation (its `kind` and coordinates, as the planner records them) from an
    analysis record (`Analysis.to_json()`); None when the analysis has no fit with a noise estimate for it."""
    kind = observation.get("kind")
    if kind == "scratch":
        return _predict("from-scratch", record.get("scratch"), {"N": observation.get("N1"), "D": observation.get("D")})
    if kind == "upcycled":
        label = group_label({c: observation.get(c) for c in GROUP_COLUMNS})
        groups = record.get("upcycled") or []
        match = next((u for u in groups if u.get("label") == label), None)
        if match is None and len(groups) == 1 and not groups[0].get("label"):
            match = groups[0]  # an ungrouped fit covers every upcycled point
        if match is None:
            return None
        return _predict(f"upcycled {label}".strip(), match.get("fit"),
                        {c: observation.get(c) for c in ("N1", "D1", "D2")})
    return None


def _predict(name: str, report: dict[str, Any] | None, point: dict[str, Any]) -> Prediction | None:
    if report is None or report.get("loo_rms") is None or any(v is None for v in point.values()):
        return None
    fitted = fitted_law(report)
    row = pd.DataFrame([{c: float(v) for c, v in point.items()}])
    if any(c not in row.columns for c in fitted.law.columns):
        return None
    loss = float(fitted.law.predict(fitted.params, row)[0])
    if not np.isfinite(loss) or loss <= 0:
        return None
    return Prediction(name, loss, _bootstrap_sd(fitted, row), float(report["loo_rms"]) / loss)


def _bootstrap_sd(fitted: FittedLaw, row: pd.DataFrame) -> float:
    """sd of log L̂ at ``row`` over the bootstrap refits (0 without a bootstrap); failed refits are skipped."""
    if fitted.samples is None:
        return 0.0
    samples = fitted.samples[np.isfinite(fitted.samples).all(axis=1)]
    if len(samples) < 2:
        return 0.0
    law = fitted.law
    losses = np.exp(law.design(row) @ law.fitted_rows(samples).T).sum(axis=0)[0]  # (terms, 1, B) -> (B,)
    logs = np.log(losses[np.isfinite(losses) & (losses > 0)])
    return float(np.std(logs, ddof=1)) if len(logs) >= 2 else 0.0
