"""The prediction ledger: before an observation segment trains, the newest analysis's predicted loss for it and its
nominal 80% and 95% intervals are written down (fitting/prediction.py); when the segment finishes, its loss scores
them. Per sweep, coverage of the two intervals and the mean absolute error say whether the analysis's intervals,
and so its D* interval, deserve trust: an 80% interval that holds 50% of the observations is too narrow.

The orchestrator hears of the ledger only through the hooks `hooks()` gives (orchestrator/hooks.py), which
`Services.open` passes to the store: the scheduler records a prediction when it launches a segment it has claimed
(the first attempt's; a retry keeps it), the store scores it in the transaction that records the observation, and
a sweep's MLflow run gets the coverage as it ends. "The newest analysis" is the newest done analysis that includes
the sweep or a sweep it extends (`POST /sweeps/{id}/extend`): an extension is predicted from what its parent sweep
taught. docs/laws.md "The prediction ledger".
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from upscale.control.analyses import latest_analysis
from upscale.control.records import AnalysisRecord, PredictionRecord, SweepOwnerRecord
from upscale.fitting.design import Z80, Z95
from upscale.fitting.prediction import predict_observation
from upscale.orchestrator.clock import as_utc, utcnow
from upscale.orchestrator.hooks import Hooks
from upscale.orchestrator.records import SegmentRecord

if TYPE_CHECKING:
    from upscale.orchestrator.store import Store

log = logging.getLogger(__name__)


def lineage(store: Store, sweep_id: str) -> list[str]:
    """``sweep_id`` and the sweeps it extends, nearest first."""
    chain: list[str] = []
    current: str | None = sweep_id
    with store.transaction() as s:
        while current is not None and current not in chain:
            chain.append(current)
            current = s.scalar(select(SweepOwnerRecord.extends).where(SweepOwnerRecord.sweep_id == current))
    return chain


def newest_analysis(store: Store, sweep_id: str) -> AnalysisRecord | None:
    """The newest done analysis of ``sweep_id`` or of a sweep it extends, or None."""
    found = [a for a in (latest_analysis(store, s) for s in lineage(store, sweep_id)) if a is not None]
    return max(found, key=lambda a: as_utc(a.finished_at or a.created_at)) if found else None


def record_prediction(store: Store, sweep_id: str, seg: SegmentRecord) -> PredictionRecord | None:
    """Write down what the newest analysis predicts for ``seg``'s observation, once per (sweep, segment); None when
    it plans no observation, no analysis exists yet, or the analysis has no fit for it. Never raises: a ledger that
    cannot predict must not stop training (the failure is logged)."""
    if seg.observation is None:
        return None
    try:
        with store.transaction() as s:
            known = s.scalar(select(PredictionRecord).where(PredictionRecord.sweep_id == sweep_id,
                                                            PredictionRecord.segment_key == seg.key))
        if known is not None:
            return known
        analysis = newest_analysis(store, sweep_id)
        if analysis is None or analysis.record is None:
            return None
        prediction = predict_observation(analysis.record, seg.observation)
        if prediction is None:
            return None
        (lo80, hi80), (lo95, hi95) = prediction.interval(Z80), prediction.interval(Z95)
        row = PredictionRecord(sweep_id=sweep_id, segment_key=seg.key, analysis_id=analysis.id, law=prediction.law,
                               predicted=prediction.loss, sigma_fit=prediction.sigma_fit,
                               sigma_noise=prediction.sigma_noise, lo80=lo80, hi80=hi80, lo95=lo95, hi95=hi95)
        with store.transaction() as s:
            s.add(row)
        return row
    except IntegrityError:  # another scheduler of this sweep wrote it first
        return None
    except Exception as e:  # a bad record, a fit that cannot be evaluated: training goes on without a prediction
        log.warning("no prediction recorded for segment %s of sweep %s: %s", seg.key, sweep_id, e)
        return None


def score(s: Session, segment_key: str, loss: float) -> None:
    """Score the predictions made for ``segment_key`` with its observed ``loss`` (in the caller's transaction)."""
    s.execute(update(PredictionRecord).where(PredictionRecord.segment_key == segment_key,
                                             PredictionRecord.observed.is_(None))
              .values(observed=float(loss), scored_at=utcnow()))


def _summary(rows: list[PredictionRecord]) -> dict[str, Any]:
    scored = [r for r in rows if r.observed is not None]
    n = len(scored)
    return {"predicted": len(rows), "scored": n,
            "coverage_80": sum(r.lo80 <= r.observed <= r.hi80 for r in scored) / n if n else None,
            "coverage_95": sum(r.lo95 <= r.observed <= r.hi95 for r in scored) / n if n else None,
            "mae": sum(abs(r.observed - r.predicted) for r in scored) / n if n else None}


def predictions(store: Store, sweep_id: str) -> list[PredictionRecord]:
    """The sweep's predictions in the order they were made; NotFoundError for an unknown sweep."""
    store.sweep(sweep_id)
    with store.transaction() as s:
        return list(s.scalars(select(PredictionRecord).where(PredictionRecord.sweep_id == sweep_id)
                              .order_by(PredictionRecord.id)))


def calibration(store: Store, sweep_id: str) -> dict[str, Any]:
    """The sweep's ledger: coverage of the nominal 80% and 95% intervals and the mean absolute error (loss units)
    over its scored predictions, overall and per fit, and every prediction. Coverage and MAE are null until one is
    scored. NotFoundError for an unknown sweep."""
    rows = predictions(store, sweep_id)
    laws = sorted({r.law for r in rows})
    return {
        "sweep_id": sweep_id, **_summary(rows),
        "by_law": {law: _summary([r for r in rows if r.law == law]) for law in laws},
        "analyses": sorted({r.analysis_id for r in rows}),
        "predictions": [{
            "segment": r.segment_key, "law": r.law, "analysis_id": r.analysis_id, "predicted": r.predicted,
            "interval_80": [r.lo80, r.hi80], "interval_95": [r.lo95, r.hi95], "sigma_fit": r.sigma_fit,
            "sigma_noise": r.sigma_noise, "observed": r.observed,
            "inside_80": None if r.observed is None else r.lo80 <= r.observed <= r.hi80,
            "inside_95": None if r.observed is None else r.lo95 <= r.observed <= r.hi95,
        } for r in rows],
    }


def mlflow_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """`calibration/*` metrics of a `calibration` summary for the sweep's MLflow parent run; none until scored."""
    if not summary["scored"]:
        return {}
    return {f"calibration/{k}": float(summary[k]) for k in ("coverage_80", "coverage_95", "mae", "scored")}


def hooks() -> Hooks:
    """The ledger's hooks into the orchestrator: predict before a launch, score with the observation, log the
    coverage on the sweep's MLflow run as it ends."""
    return Hooks(before_launch=record_prediction, on_observation=score,
                 sweep_metrics=lambda store, sweep_id: mlflow_metrics(calibration(store, sweep_id)))
