"""What a D* rests on when predicted decay ends stand beside observed ones (docs/laws.md, "Curves as observations").

Predicted rows (fitting/curve_observations.py) join the observed tables with a weight below 1: σ² / (σ² + sd_pred²),
σ the per-point noise of log loss that the fits of the observed rows alone leave (fitting/design.py's moment
estimate, which counts what each fit absorbed).

Each D* then says how much of its precision the predicted rows carry, by the weighted least-squares delta method:
log D* moves with the two laws' free parameters θ by c = d log D*/dθ, and a weighted fit's θ moves with row i's log
loss by M⁻¹ w_i j_i (M = Σ_i w_i j_i j_iᵀ, j_i = d log L̂_i/dθ). So Var(log D*) ∝ cᵀM⁻¹c = Σ_i w_i (cᵀM⁻¹j_i)²:
row i's share of D*'s variance is its term over that sum, the shares sum to 1, and the predicted share is the sum of
the predicted rows' shares. The two laws are fitted apart, so their terms simply add.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from upscale.fitting.curve_observations import (
    OBSERVED,
    SD_PRED,
    SOURCE,
    PredictedDecays,
    is_predicted,
    prediction_weight,
)
from upscale.fitting.design import (
    PRIOR_SD,
    Noise,
    Rows,
    dstar_gradient,
    log_loss_jacobian,
    noise_from_fits,
    variance_shares,
)
from upscale.fitting.laws import LOSS, TRUNK, WEIGHT
from upscale.fitting.summary import FittedLaw

DOMINANT_SHARE = 0.5  # a D* with more of its precision on predicted rows is a problem: observe some of them
NAMED_TRUNKS = 5  # the trunks whose predicted rows carry most of a D*, named so that a user knows what to observe


def _free(fitted: FittedLaw, fixed: Mapping[str, float]) -> tuple[str, ...]:
    return tuple(n for n in fitted.law.param_names if n not in fixed)


def _rows(fitted: FittedLaw, fixed: Mapping[str, float], df: pd.DataFrame) -> tuple[np.ndarray, Rows]:
    """The log-loss residuals of ``df``'s rows at the fit and their Rows (Jacobian, trunk)."""
    loss, J = log_loss_jacobian(fitted.law, fitted.params, df, _free(fitted, fixed))
    trunks = tuple(df[TRUNK].astype(str)) if TRUNK in df.columns else tuple(range(len(df)))
    return np.log(df[LOSS].to_numpy(dtype=float)) - np.log(loss), Rows(J, trunks)


def point_noise(fits: Sequence[tuple[FittedLaw, Mapping[str, float], pd.DataFrame]]) -> Noise:
    """σ and τ of log loss from fits of observed rows ((fitted law, its fixed parameters, its table)); the prior
    (PRIOR_SD) without any."""
    if not fits:
        return Noise(PRIOR_SD, PRIOR_SD)
    return noise_from_fits([_rows(f, fixed, df) for f, fixed, df in fits])


def with_predicted(tables: Mapping[str, pd.DataFrame], predicted: PredictedDecays,
                   point_sd: float) -> dict[str, pd.DataFrame]:
    """The observed tables (``source`` "observed", weight 1) with the predicted rows (weighted) appended."""
    out = {}
    for kind, df in tables.items():
        rows = predicted.tables.get(kind)
        observed = df.assign(**{SOURCE: OBSERVED, WEIGHT: 1.0})
        if rows is None or rows.empty:
            out[kind] = observed
            continue
        rows = rows.assign(**{WEIGHT: prediction_weight(point_sd, rows[SD_PRED].to_numpy(dtype=float))})
        out[kind] = pd.concat([observed, rows], ignore_index=True)
    return out


def dstar_evidence(moe: tuple[FittedLaw, Mapping[str, float], pd.DataFrame],
                   up: tuple[FittedLaw, Mapping[str, float], pd.DataFrame], n1: float) -> dict[str, Any]:
    """What D* at ``n1`` rests on: observed and predicted rows behind each law (``scratch``, ``upcycled``), the
    share of its precision on predicted rows (None where the laws do not cross), the largest held-out sd of those
    rows and the NAMED_TRUNKS trunks whose predicted rows carry most of it (what to observe to take weight off the
    predictions)."""
    (mf, mfix, mdf), (uf, ufix, udf) = moe, up
    pred = {"scratch": is_predicted(mdf), "upcycled": is_predicted(udf)}
    out: dict[str, Any] = {"observed": {k: int((~v).sum()) for k, v in pred.items()},
                           "predicted": {k: int(v.sum()) for k, v in pred.items()},
                           "predicted_share": None, "held_out_sd": None, "predicted_trunks": []}
    sds = [float(s) for df, p in ((mdf, pred["scratch"]), (udf, pred["upcycled"])) if p.any()
           for s in df.loc[p, SD_PRED]]
    if sds:
        out["held_out_sd"] = max(sds)
    _, c = dstar_gradient(mf, uf, n1, _free(mf, mfix), _free(uf, ufix))
    if c is None:
        return out
    p = len(_free(mf, mfix))
    parts = []
    for (f, fixed, df), cc in (((mf, mfix, mdf), c[:p]), ((uf, ufix, udf), c[p:])):
        _, J = log_loss_jacobian(f.law, f.params, df, _free(f, fixed))
        parts.append((cc, J, df[WEIGHT].to_numpy(dtype=float) if WEIGHT in df.columns else np.ones(len(df))))
    shares = variance_shares(parts)
    if not np.all(np.isfinite(shares)):
        return out
    mask = np.concatenate([pred["scratch"], pred["upcycled"]])
    out["predicted_share"] = float(shares[mask].sum())
    trunks = np.concatenate([mdf[TRUNK].astype(str).to_numpy() if TRUNK in mdf.columns else np.full(len(mdf), ""),
                             udf[TRUNK].astype(str).to_numpy() if TRUNK in udf.columns else np.full(len(udf), "")])
    by_trunk: dict[str, float] = {}
    for t, s in zip(trunks[mask], shares[mask], strict=True):
        by_trunk[t] = by_trunk.get(t, 0.0) + float(s)
    out["predicted_trunks"] = [t for t, _ in sorted(by_trunk.items(), key=lambda kv: -kv[1])][:NAMED_TRUNKS]
    return out


def evidence_problem(evidence: dict[str, Any], n1: float, law: str, fit: str) -> dict[str, Any] | None:
    """A problem when D* at ``n1`` rests mostly on predicted decays (share above DOMINANT_SHARE), None otherwise."""
    share = evidence.get("predicted_share")
    if share is None or not math.isfinite(share) or share <= DOMINANT_SHARE:
        return None
    n_pred, n_obs = sum(evidence["predicted"].values()), sum(evidence["observed"].values())
    trunks = evidence["predicted_trunks"][:3]
    return {"law": law, "fit": fit, "kind": "predicted", "n1": n1,
            "why": f"D* at N1={n1:.3g} rests mostly on predicted decays ({share:.0%} of its precision on {n_pred} "
                   f"predicted, {1 - share:.0%} on {n_obs} observed)",
            "add": f"observed decays where the predictions stand in for them: train the planned decays of trunk(s) "
                   f"{', '.join(trunks)}"}
