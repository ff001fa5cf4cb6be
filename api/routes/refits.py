"""/refit-schedules and /refits: when to refit, forcing one now, and the versioned history."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Query

from upscale.api.auth import Principal
from upscale.api.routes.deps import AUTH_ERRORS, NOT_FOUND, Reader, ServicesDep, Writer
from upscale.control import refits
from upscale.control.analysis_jobs import TooManyAnalyses
from upscale.control.records import RefitRecord, RefitScheduleRecord
from upscale.control.schemas import RefitPublic, RefitScheduleCreate, RefitSchedulePublic

router = APIRouter(tags=["refits"], responses=AUTH_ERRORS)


def _schedule(r: RefitScheduleRecord) -> RefitSchedulePublic:
    return RefitSchedulePublic.model_validate(r, from_attributes=True)


def _refit(r: RefitRecord) -> RefitPublic:
    return RefitPublic.model_validate(r, from_attributes=True)


def _schedule_or_404(services: ServicesDep, schedule_id: str) -> RefitScheduleRecord:
    record = refits.get_schedule(services, schedule_id)
    if record is None:
        raise HTTPException(404, f"no refit schedule {schedule_id!r}")
    return record


def _owned_schedule(services: ServicesDep, schedule_id: str, caller: Principal) -> RefitScheduleRecord:
    """The schedule, if ``caller`` may change it: 404 if there is none, 403 if it is another name's."""
    record = _schedule_or_404(services, schedule_id)
    caller.check_modify(record.owner, f"refit schedule {schedule_id}")
    return record


@router.post("/refit-schedules", status_code=201, summary="Create a refit schedule",
             response_model=RefitSchedulePublic, responses=NOT_FOUND)
def create_schedule(body: RefitScheduleCreate, services: ServicesDep, owner: Writer) -> RefitSchedulePublic:
    """Run the analysis on the sweeps' observations on a 5-field cron, or whenever they change, each run a new
    versioned refit with D* at `request.n1` (a parameter count up to 1e18, as for analyses). The schedule is the
    caller's; its sweeps may be anyone's (it only reads their observations), and its analyses stay its own: they
    never become the analysis a sweep's decisions answer from."""
    return _schedule(refits.create_schedule(services, body, owner.name))


@router.get("/refit-schedules", summary="List refit schedules", response_model=list[RefitSchedulePublic])
def list_schedules(services: ServicesDep, _: Reader,
                   all: bool = Query(False, description="Include deleted (inactive) schedules.")
                   ) -> list[RefitSchedulePublic]:
    """Every owner's schedules (a read token sees all), with their last error, if their latest refit failed."""
    return [_schedule(r) for r in refits.schedules(services, active_only=not all)]


@router.delete("/refit-schedules/{schedule_id}", status_code=204, summary="Delete a refit schedule",
               responses=NOT_FOUND)
def delete_schedule(schedule_id: str, services: ServicesDep, caller: Writer) -> None:
    """Stop the schedule; its refit records are kept. Only its owner or an admin token may (403 otherwise)."""
    _owned_schedule(services, schedule_id, caller)
    refits.deactivate(services, schedule_id)


@router.post("/refit-schedules/{schedule_id}/run", status_code=201, summary="Refit now",
             response_model=RefitPublic,
             responses={**NOT_FOUND, 409: {"description": "The sweeps have no observations yet, or the analysis of "
                                           "these inputs is running for another of the owner's triggers."},
                        422: {"description": "A fit failed."},
                        429: {"description": "The caller has as many requested analyses running as one token name "
                              "may."}})
def run_schedule(schedule_id: str, services: ServicesDep, caller: Writer) -> RefitPublic:
    """Refit at once and record the next version, whether or not the inputs changed; it counts as one of the
    caller's requested analyses while it runs (429 past the bound). Only the schedule's owner or an admin token may
    (403 otherwise)."""
    schedule = _owned_schedule(services, schedule_id, caller)
    try:
        with services.jobs.reserve(caller.name):
            return _refit(refits.run_refit(services, schedule, force=True))
    except TooManyAnalyses as e:
        raise HTTPException(429, str(e)) from None


@router.get("/refits", summary="Refit history", response_model=list[RefitPublic])
def list_refits(services: ServicesDep, _: Reader,
                schedule_id: str | None = Query(None, description="Only this schedule's versions.")
                ) -> list[RefitPublic]:
    """Every refit version: inputs hash, the analysis it ran, D* and interval, diff from the previous version,
    interval flag."""
    return [_refit(r) for r in refits.refits(services, schedule_id)]
