"""GET /sweeps/{id}/calibration: the sweep's prediction ledger (control/ledger.py), how far to trust its
analysis's intervals."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from upscale.api.routes.deps import AUTH_ERRORS, NOT_FOUND, Reader, ServicesDep
from upscale.control import ledger
from upscale.control.schemas import CalibrationPublic

router = APIRouter(prefix="/sweeps", tags=["sweeps"], responses=AUTH_ERRORS)


@router.get("/{sweep_id}/calibration", summary="How the analysis's predictions for a sweep scored",
            response_model=CalibrationPublic, responses=NOT_FOUND)
def sweep_calibration(sweep_id: str, services: ServicesDep, _: Reader) -> dict[str, Any]:
    """Before each of the sweep's observation segments trained, the newest analysis of the sweep (or of a sweep it
    extends) predicted its loss with nominal 80% and 95% intervals; once it finished, the loss scored them. Coverage
    near 0.8 and 0.95 says the analysis's intervals, D*'s included, can be trusted; far below, they are too narrow.
    Figures are null until a prediction is scored; a sweep that ran before any analysis existed has none."""
    return ledger.calibration(services.store, sweep_id)
