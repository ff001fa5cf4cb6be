"""/refit-schedules and /refits: when to refit, refitting now, and the versioned history."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from upscale.api.auth import check_modify
from upscale.api.routes.deps import AUTH_ERRORS, NOT_FOUND, Reader, ServicesDep, Writer, json_example
from upscale.control import refits
from upscale.control.analysis_jobs import TooManyAnalyses
from upscale.control.records import RefitRecord, RefitScheduleRecord
from upscale.control.schemas import (
    REFIT_SCHEDULE_EXAMPLES,
    RefitPublic,
    RefitRequest,
    RefitRun,
    RefitScheduleCreate,
    RefitSchedulePublic,
)
from upscale.control.tokens import Principal

router = APIRouter(tags=["refits"], responses=AUTH_ERRORS)

# The responses' examples, built through their models (a wrong one fails at import): what a schedule of the first
# request example and its second version look like.
_CREATED = datetime(2026, 1, 31, 3, 0, 0, 412000, tzinfo=UTC)
_SCHEDULE = RefitSchedulePublic(id="5c0d9e2a7b13", owner="alice", active=True, last_error=None, created_at=_CREATED,
                                **{**REFIT_SCHEDULE_EXAMPLES[0],
                                   "request": RefitRequest(**REFIT_SCHEDULE_EXAMPLES[0]["request"])})
_VERSION = RefitPublic(
    schedule_id=_SCHEDULE.id, version=2, inputs_hash="9d4c1f0e" * 8, analysis_id="a41f0c9e27b3",
    dstar=3.1e10, dstar_group="naive 8x2", left_interval=False, created_at=_CREATED,
    diff={"scratch": {"A": -12.5, "alpha": -0.004}, "upcycled naive 8x2": {"A": 3.2, "alpha1": 0.002}, "dstar": 2.4e9},
    dstar_answer={"n1": 1.0e9, "dstar": 3.1e10, "dstar_state": "crossing", "search_range": [2.0e8, 4.1e12],
                  "intervals": {"80": {"low": 2.2e10, "high": 4.6e10, "low_open": False, "high_open": False},
                                "95": {"low": 1.8e10, "high": 6.0e10, "low_open": False, "high_open": False}},
                  "interval_note": "", "health": "ok", "health_problems": [],
                  "extrapolation": {"n1_factor": 1.0, "tokens_factor": 1.5, "interval_factor": 2.9,
                                    "interval_open": False, "factor": 10.0, "flagged": False,
                                    "note": "D2=3.1e+10 is 1.5x above the range trained (2e+09–2.05e+10)"}})


def _run_example(unchanged: bool) -> dict[str, Any]:
    return RefitRun(**_VERSION.model_dump(), unchanged=unchanged).model_dump(mode="json")


def _schedule(r: RefitScheduleRecord) -> RefitSchedulePublic:
    return RefitSchedulePublic.model_validate(r, from_attributes=True)


def _refit(r: RefitRecord) -> RefitPublic:
    return RefitPublic.model_validate(r, from_attributes=True)


def _schedule_or_404(services: ServicesDep, schedule_id: str) -> RefitScheduleRecord:
    record = refits.get_schedule(services, schedule_id)
    if record is None:
        raise HTTPException(404, f"no refit schedule {schedule_id!r}: GET /refit-schedules?all=true lists them")
    return record


def _owned_schedule(services: ServicesDep, schedule_id: str, caller: Principal) -> RefitScheduleRecord:
    """The schedule, if ``caller`` may change it: 404 if there is none, 403 if it is another name's."""
    record = _schedule_or_404(services, schedule_id)
    check_modify(caller, record.owner, f"refit schedule {schedule_id}")
    return record


@router.post("/refit-schedules", status_code=201, summary="Create a refit schedule",
             response_model=RefitSchedulePublic,
             responses={**NOT_FOUND, 201: json_example(_SCHEDULE.model_dump(mode="json"))})
def create_schedule(body: RefitScheduleCreate, services: ServicesDep, owner: Writer) -> RefitSchedulePublic:
    """Rerun the analysis on the sweeps' observations on a 5-field cron (UTC) or whenever they change, recording a
    new version each time the inputs changed. `request.n1` (a parameter count up to 1e18) is where D* is reported,
    by default the largest size the sweeps trained; `request.bootstrap` defaults to the analyses' 100 refits per fit,
    so that each version has D*'s interval. The schedule is the caller's; its sweeps may be anyone's (it only reads
    their observations), and its analyses stay its own: they never become the analysis a sweep's decisions answer
    from. `upscale refit schedule create` does the same from the command line."""
    return _schedule(refits.create_schedule(services, body, owner.name))


@router.get("/refit-schedules", summary="List refit schedules", response_model=list[RefitSchedulePublic],
            responses={200: json_example([_SCHEDULE.model_dump(mode="json")])})
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
             response_model=RefitRun,
             responses={**NOT_FOUND,
                        201: json_example(_run_example(unchanged=False)),
                        200: {"model": RefitRun, "description": "The inputs are the latest version's: that version, "
                              "`unchanged` true; nothing was recorded and no analysis ran.",
                              **json_example(_run_example(unchanged=True))},
                        409: {"description": "The sweeps have no observations yet, or the analysis of these inputs is "
                              "running for another of the owner's triggers."},
                        422: {"description": "A fit failed."},
                        429: {"description": "The caller has as many requested analyses running as one token name "
                              "may, or the server's heavy-request threads and queue are full (Retry-After)."}})
async def run_schedule(schedule_id: str, request: Request, services: ServicesDep, caller: Writer,
                       response: Response) -> RefitRun:
    """Refit at once: when the sweeps' observations changed since the latest version, run the analysis and record
    the next version (201), else answer with the latest version (200, `unchanged`). It counts as one of the
    caller's requested analyses while it runs (429 past the bound), and computes on the server's heavy-request
    threads (429 when they and their queue are full). Only the schedule's owner or an admin token may (403
    otherwise); 404 for a deleted schedule, which records no version any more."""
    schedule = await run_in_threadpool(_owned_schedule, services, schedule_id, caller)
    if not schedule.active:
        raise HTTPException(404, f"refit schedule {schedule_id!r} was deleted: it runs no more refits (its versions "
                                 f"stay listed by GET /refits); create a new schedule to refit again")
    try:
        with services.jobs.reserve(caller.name):
            record = await request.app.state.heavy.run(refits.run_refit, services, schedule, True)
    except TooManyAnalyses as e:
        raise HTTPException(429, str(e)) from None
    if not record.new:
        response.status_code = 200
    return refits.run_answer(record)


@router.get("/refits", summary="Refit history", response_model=list[RefitPublic],
            responses={200: json_example([_VERSION.model_dump(mode="json")])})
def list_refits(services: ServicesDep, _: Reader,
                schedule_id: str | None = Query(None, description="Only this schedule's versions.")
                ) -> list[RefitPublic]:
    """Every refit version, oldest first: inputs hash, the analysis it ran, D* with its whole answer (interval,
    extrapolation, health), the diff from the previous version per law and parameter, and whether D* left the
    previous 95% interval."""
    return [_refit(r) for r in refits.refits(services, schedule_id)]
