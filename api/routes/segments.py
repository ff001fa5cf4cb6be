"""/segments/{key}/invalidate: retrain a segment whose checkpoint is corrupt or lost, and what was trained from it.

An admin route: segments are shared by every sweep that needs them, whoever submitted it, so no write token owns one.
"""

from __future__ import annotations

from fastapi import APIRouter, Path

from upscale.api.routes.deps import AUTH_ERRORS, NOT_FOUND, Admin, ServicesDep
from upscale.control import segments
from upscale.control.schemas import SegmentsInvalidated

router = APIRouter(prefix="/segments", tags=["segments"], responses=AUTH_ERRORS)

SEGMENT_KEY = Path(pattern="^[0-9a-f]{16}$", description="A segment's content id (16 hex digits; `upscale segments "
                   "SWEEP` lists a sweep's).")


@router.post("/{key}/invalidate", summary="Retrain a segment and its descendants", response_model=SegmentsInvalidated,
             responses={**NOT_FOUND, 409: {"description": "The segment is not done, or one trained from it is "
                                                          "running (cancel its sweep first)."}})
def invalidate_segment(services: ServicesDep, admin: Admin, key: str = SEGMENT_KEY) -> SegmentsInvalidated:
    """Mark the done segment and every segment trained from it pending again: their results, observations and
    checkpoints are dropped, and the sweeps holding them that had ended go back to pending, so the scheduler
    retrains them. For a checkpoint a worker reported corrupt or missing; recorded with the token's name."""
    return segments.invalidate(services, key, admin.name)
