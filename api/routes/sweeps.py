"""/sweeps: submit (JSON or YAML), list, inspect, cancel, extend, suggest extensions, and export observations."""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import Response

from upscale.api.auth import check_modify
from upscale.api.routes.deps import AUTH_ERRORS, NOT_FOUND, Reader, ServicesDep, Writer, json_example
from upscale.control import sweeps
from upscale.control.plans import estimate_basis, plan_summary
from upscale.control.schemas import (
    SegmentProgress,
    Suggestion,
    SuggestRequest,
    SweepCreated,
    SweepDetail,
    SweepExtend,
    SweepSummary,
    SweepTiming,
)
from upscale.orchestrator.observations import as_row, table
from upscale.orchestrator.plan_in_store import PlanInStore
from upscale.orchestrator.records import ObservationRecord
from upscale.sweeps.loader import DEMO_SPEC, load_spec, parse_document
from upscale.sweeps.planner import eta_s, plan, segment_seconds
from upscale.sweeps.spec import SweepSpec

router = APIRouter(prefix="/sweeps", tags=["sweeps"], responses=AUTH_ERRORS)

# The body is read raw (YAML or JSON) so FastAPI cannot derive its schema: the route documents SweepSpec's, whose
# sub-models api/app.py adds to the OpenAPI components. The examples are real specs that plan: the demo's, as the
# model reads it (YAML's 1.2288e5 is a string to a YAML 1.1 loader, a number once validated), and small ones of
# each shape of grid, so a client (and the schemathesis run of tests/api/test_schema.py) has valid bodies to send.
_SPEC_SCHEMA = SweepSpec.model_json_schema(ref_template="#/components/schemas/{model}")
SPEC_COMPONENTS: dict[str, Any] = {"SweepSpec": {k: v for k, v in _SPEC_SCHEMA.items() if k != "$defs"},
                                   **_SPEC_SCHEMA.get("$defs", {})}
_TINY: dict[str, Any] = {
    "name": "tiny", "model": {"sizes": ["nano"]}, "moe": {"experts": [2], "topk": [1]},
    "upcycling": {"methods": ["naive"]}, "tokens": {"d1": [1024], "d2": [512, 1024]},
    "train": {"context": 16, "batch_size": 4, "lr": {"dense": 0.003, "moe": 0.002}, "warmup_tokens": 64}}
_SPEC_EXAMPLES: dict[str, dict[str, Any]] = {
    "demo": {"summary": "The demo's sweep (`upscale demo`)",
             "value": load_spec(DEMO_SPEC).model_dump(mode="json", exclude_unset=True)},
    "tiny": {"summary": "One size, one MoE, naive upcycling", "value": _TINY},
    "scratch-and-drop": {"summary": "Drop-Upcycling at two ratios beside from-scratch MoEs", "value": {
        **_TINY, "name": "scratch-and-drop", "moe": {"experts": [2, 4], "topk": [1]},
        "upcycling": {"methods": ["naive", "drop"], "r": [0.25, 0.5]},
        "tokens": {"d1": [1024], "d2": [1024], "scratch": [1024, 2048]}}},
    "lr-search": {"summary": "Peak LRs found by an Optuna search per model", "value": {
        **_TINY, "name": "lr-search", "train": {**{k: v for k, v in _TINY["train"].items() if k != "lr"},
                                               "lr_search": {"trials": 2, "low": 0.0001, "high": 0.01,
                                                             "tokens": 512}}}},
}
_EXAMPLE_ID = "3f9c2a1b7d04"
_SPEC_MEDIA = {"schema": {"$ref": "#/components/schemas/SweepSpec"}, "examples": _SPEC_EXAMPLES}
SPEC_BODY = {"requestBody": {
    "required": True,
    "description": "A sweep spec as JSON, or as YAML with `Content-Type: application/yaml` (the file `upscale plan` "
                   "reads). Every problem comes back at once, each with its field path.",
    "content": {"application/json": _SPEC_MEDIA, "application/yaml": _SPEC_MEDIA}}}


def _created_example() -> dict[str, Any]:
    """What submitting the tiny example to an empty store answers: its plan summary computed here, not written out."""
    spec = SweepSpec.model_validate(_TINY)
    summary = plan_summary(PlanInStore(plan(spec)), spec)
    return SweepCreated(id=_EXAMPLE_ID, name=spec.name, status="pending", owner="alice",
                        plan=summary).model_dump(mode="json")


def _detail_example() -> dict[str, Any]:
    """The tiny example's sweep running on an empty store, its first half of segments done: its real plan's
    segments, axes and planned times (control/timing.py's figures, the pace 1.5x slower than planned)."""
    spec = SweepSpec.model_validate(_TINY)
    p = plan(spec)
    seconds = segment_seconds(p)
    half = len(p.segments) // 2
    status = ["done"] * half + ["running"] + ["pending"] * (len(p.segments) - half - 1)
    segs = [SegmentProgress(key=s.id, kind=s.spec.kind, status=st, attempts=int(st != "pending"), tokens=s.tokens,
                            flops=s.flops, axes=s.axes, val_loss=3.41 if st == "done" and s.observation else None,
                            error=None) for s, st in zip(p.segments, status, strict=True)]
    planned, planned_done = sum(seconds.values()), sum(seconds[s.key] for s in segs if s.status == "done")
    waiting = sum(seconds[s.key] for s in segs if s.status == "pending")
    created = datetime(2026, 1, 31, 12, 0, tzinfo=UTC)
    timing = SweepTiming(segments_to_train=len(segs), segments_trained=half, segments_reused=0, planned_s=planned,
                         basis=estimate_basis(), elapsed_s=1.5 * planned_done,
                         time_left_s=eta_s(planned, planned_done, 1.5 * planned_done, waiting),
                         tokens_trained=sum(s.tokens for s in segs if s.status == "done"), tokens_per_s=2400.0,
                         as_of=created + timedelta(seconds=1.5 * planned_done))
    return SweepDetail(id=_EXAMPLE_ID, name=spec.name, status="running", owner="alice", segments_done=half,
                       segments_total=len(segs), created_at=created, error=None, mlflow_run_id="8d1c0b6e5f2a4e21",
                       by_status=dict(Counter(status)), flops_done=sum(s.flops for s in segs if s.status == "done"),
                       flops_planned=sum(s.flops for s in segs), stale_segments={}, reuse_stale=False,
                       timing=timing, segments=segs).model_dump(mode="json")


_CREATED_EXAMPLE, _DETAIL_EXAMPLE = _created_example(), _detail_example()  # planned once, at import


def _summary_example(status: str) -> dict[str, Any]:
    d = _DETAIL_EXAMPLE
    return SweepSummary.model_validate({**{k: d[k] for k in SweepSummary.model_fields}, "status": status}
                                       ).model_dump(mode="json")


def _observations_example() -> list[dict[str, Any]]:
    """Two rows of the tiny example's table, as GET /sweeps/{id}/observations returns them once trained."""
    rows = [ObservationRecord(segment_key=s.id, loss=loss, trunk=s.trunk, mlflow_run_id="2b7e91c04d3f4a58",
                              **dataclasses.asdict(s.observation))
            for s, loss in zip((s for s in plan(SweepSpec.model_validate(_TINY)).segments if s.observation),
                               (3.52, 3.38), strict=False)]
    return [as_row(o) for o in rows]


# A real answer (trimmed to its first two actions) of the suggestion on a planned 3-size naive 4x2 grid whose losses
# follow a known law (tests/api/test_suggest.py's): D* near the grid, each action's interval narrower than the last.
_SUGGESTION_EXAMPLE = {
    "sweep_id": "3a1d007e9db7", "analysis_id": "4c8c34fab10a", "group": "naive 4x2", "n1": 16480.0,
    "dstar": 3.31e6, "interval": [2.29e4, 5.13e6], "delta_interval": [1.98e6, 5.54e6],
    "profile_interval": [2.31e6, None],
    "noise": {"point_sd": 0.0024, "trunk_sd": 0.0025}, "budget_flops": 6e12, "total_flops": 5.78e12,
    "expected_interval": [2.37e6, 4.63e6], "stopped": "budget",
    "actions": [
        {"rank": 1, "kind": "d1", "description": "dense budget D1 4e+06 tokens",
         "additions": {"tokens": {"d1": [4e6]}}, "marginal_flops": 2.56e12, "new_observations": 9,
         "expected_interval": [2.30e6, 4.76e6]},
        {"rank": 2, "kind": "d1", "description": "dense budget D1 8e+06 tokens",
         "additions": {"tokens": {"d1": [8e6]}}, "marginal_flops": 3.22e12, "new_observations": 9,
         "expected_interval": [2.37e6, 4.63e6]}],
    "additions": {"tokens": {"d1": [4e6, 8e6]}}, "applied": None,
    "stop": [{"trunk": "9f31c0d2a7b4", "pending_observations": 1, "remaining_flops": 1.1e12, "sd_shrink": 0.004}]}


IN_FLIGHT_OR_BUSY = {"description": "The token has UPSCALE_MAX_SWEEPS_IN_FLIGHT sweeps pending or running, or the "
                     "server's heavy-request threads and queue are full (Retry-After says when to try again)."}


def _submit(services: ServicesDep, raw: bytes, fmt: Literal["json", "yaml"], owner: str, new: bool,
            reuse_stale: bool) -> SweepCreated:
    """Check the owner's quota, parse, admit, plan and record: seconds for a large grid, so it runs on a heavy-request
    thread (api/heavy.py), never on the event loop or the threads that answer every other request."""
    sweeps.refuse_past_quota(services, owner)
    return sweeps.submit(services, sweeps.admit(services, parse_document(raw, fmt)), owner, new=new,
                         reuse_stale=reuse_stale)


@router.post("", status_code=201, summary="Submit a sweep", response_model=SweepCreated, openapi_extra=SPEC_BODY,
             responses={201: json_example(_CREATED_EXAMPLE),
                        200: {"model": SweepCreated,
                              "description": "The caller's existing sweep of this identical spec (`existing`)."},
                        413: {"description": "The body is larger than UPSCALE_MAX_BODY_BYTES."},
                        429: IN_FLIGHT_OR_BUSY,
                        422: {"description": "Invalid spec: every problem with its field path (also: a grid over "
                                             "UPSCALE_MAX_SEGMENTS, data.corpus outside the data roots, resources "
                                             "the cluster does not have, YAML aliases)."}})
async def submit_sweep(request: Request, response: Response, services: ServicesDep, owner: Writer,
                       new: bool = Query(False, description="Record a new sweep even if the caller already has one "
                                         "of this identical spec."),
                       reuse_stale: bool = Query(False, description="Take over segments the store holds trained under "
                                                 "an older training-semantics version (`plan.stale_segments`) "
                                                 "instead of retraining them; recorded on the sweep.")
                       ) -> SweepCreated:
    """Validate and plan a sweep spec, record it under the caller's token name, and queue it for the scheduler.
    Segments any earlier sweep already trained are shared, not retrained (`plan.new_segments`, `plan.new_tokens`).
    `plan` is the summary `upscale plan` prints: segments, tokens and FLOPs, the saving, the time estimate of what
    will train, and each law of the analysis the grid cannot identify with what to add to the spec.
    Segments trained under an older training-semantics version (the code has changed what they compute) are stale
    (`plan.stale_segments`): retrained unless `reuse_stale=true`. Re-submitting a spec identical to one of the
    caller's sweeps returns that sweep with 200 and `existing: true` (queued again if it failed or was cancelled),
    unless `new=true`."""
    fmt = "yaml" if "yaml" in request.headers.get("content-type", "") else "json"
    created = await request.app.state.heavy.run(_submit, services, await request.body(), fmt, owner.name, new,
                                                reuse_stale)
    if created.existing:
        response.status_code = 200
    return created


@router.get("", summary="List sweeps", response_model=list[SweepSummary],
            responses={200: json_example([_summary_example("running")])})
def list_sweeps(services: ServicesDep, _: Reader) -> list[SweepSummary]:
    """Every sweep of every owner, oldest first, with its status, owner and segments done: a read token sees all
    sweeps (a shared team store); only their owner (or an admin token) may change them."""
    return sweeps.summaries(services)


@router.get("/{sweep_id}", summary="A sweep's status and progress", response_model=SweepDetail,
            responses={**NOT_FOUND, 304: {"description": "Unchanged since the ETag sent in If-None-Match."},
                       200: json_example(_DETAIL_EXAMPLE)})
def get_sweep(sweep_id: str, request: Request, services: ServicesDep, _: Reader) -> Response:
    """Status, every segment's state and attempts, and FLOPs done so far vs planned. Pollers can send the
    `ETag` back as `If-None-Match`: 304 with no body until something changes."""
    etag, body = sweeps.detail_json(services, sweep_id)
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers={"ETag": etag})
    return Response(body, media_type="application/json", headers={"ETag": etag})


@router.post("/{sweep_id}/cancel", summary="Cancel a sweep", response_model=SweepSummary,
             responses={**NOT_FOUND, 200: json_example(_summary_example("cancelling"))})
def cancel_sweep(sweep_id: str, services: ServicesDep, caller: Writer) -> SweepSummary:
    """A running sweep stops after releasing its running segments (they resume if it is submitted again); a pending
    one is cancelled at once. Only the sweep's owner or an admin token may cancel it (403 otherwise)."""
    check_modify(caller, sweeps.owner_of(services, sweep_id), f"sweep {sweep_id}")
    return sweeps.cancel(services, sweep_id)


def _extend(services: ServicesDep, sweep_id: str, body: SweepExtend, owner: str) -> SweepCreated:
    sweeps.refuse_past_quota(services, owner)
    return sweeps.extend(services, sweep_id, body.additions, owner, body.reuse_stale)


@router.post("/{sweep_id}/extend", status_code=201, summary="Add grid points to a sweep",
             response_model=SweepCreated,
             responses={**NOT_FOUND, 200: {"model": SweepCreated, "description": "The caller's existing sweep of the "
                                           "extended spec (`existing`): nothing was added."},
                        201: json_example(_CREATED_EXAMPLE), 429: IN_FLIGHT_OR_BUSY})
async def extend_sweep(sweep_id: str, body: SweepExtend, request: Request, response: Response, services: ServicesDep,
                       owner: Writer) -> SweepCreated:
    """Submit a new sweep whose spec is this one's plus `additions` (lists unioned): only its new segments train.
    The new sweep is the caller's, so any write token may extend any sweep (it only reads the old one's spec, which
    every read token sees). If the caller already has a sweep of the extended spec, that sweep is returned with 200
    and `existing: true`. Planning runs on the server's heavy-request threads (429 when they and their queue are
    full)."""
    created = await request.app.state.heavy.run(_extend, services, sweep_id, body, owner.name)
    if created.existing:
        response.status_code = 200
    return created


@router.get("/{sweep_id}/observations", summary="A sweep's observations (JSON or CSV)",
            response_model=list[dict[str, Any]],
            responses={**NOT_FOUND, 200: {"content": {"text/csv": {}, "application/json": {
                "example": _observations_example()}}}})
def sweep_observations(sweep_id: str, request: Request, services: ServicesDep, _: Reader,
                       format: Literal["json", "csv"] | None = Query(
                           None, description="csv: the table `upscale fit --data` reads; default from Accept."),
                       kind: Literal["dense", "upcycled", "scratch", "expanded"] | None = Query(
                           None, description="Only the rows of one kind (one law's table, or the expanded MoEs').")
                       ) -> Any:
    """One row per finished decay segment: kind, N, D, N1, D1, D2, N2, P, parent_experts, loss, trunk, segment,
    MLflow run."""
    records = sweeps.observations(services, sweep_id, kind)
    if format == "csv" or (format is None and "text/csv" in request.headers.get("accept", "")):
        return Response(table(records).to_csv(index=False), media_type="text/csv")
    return [as_row(o) for o in records]


@router.post("/{sweep_id}/suggest", summary="Suggest grid extensions that shrink the D* interval",
             response_model=Suggestion,
             responses={**NOT_FOUND, 200: json_example(_SUGGESTION_EXAMPLE),
                        409: {"description": "The sweep was cancelled, or no analysis can answer yet (the detail "
                                             "says what to run)."},
                        422: {"description": "A budget too small for any extension (at `budget_flops`), or a `study` "
                              "the analysis does not have (at `study`)."},
                        429: {"description": "With `apply`, the token has UPSCALE_MAX_SWEEPS_IN_FLIGHT sweeps pending "
                              "or running; or the server's heavy-request threads and queue are full (Retry-After "
                              "says when to try again)."}})
async def suggest_extensions(sweep_id: str, body: SuggestRequest, request: Request, services: ServicesDep,
                             caller: Reader) -> Suggestion:
    """Candidate extensions of the sweep (new D1, D2 or from-scratch budgets beyond, below or between the grid's on
    its trunks, a larger dense size), ranked by the expected shrinkage of the D* interval at `n1` per FLOP (c-optimal
    on D*, branches of one trunk correlated) and chosen greedily within `budget_flops`, until the expected interval
    is within `tolerance`. With `study` (an expansion study's label), the D* is that study's D*_expand, and its rows
    are the m·E MoE's from-scratch decays and the study's expanded ones. Each action's FLOPs are marginal (what the
    store holds is free). `stop` lists the trunks still training whose remaining decays would barely move D*, with
    the FLOPs stopping them saves. With `apply`, the chosen extensions are submitted as a new sweep, as POST
    /sweeps/{id}/extend would (`applied`): that needs a write token, suggesting a read one. It computes on the
    server's heavy-request threads (429 when they and their queue are full)."""
    from upscale.control.suggest import SuggestError, suggest

    if body.apply and not caller.has("write"):
        raise HTTPException(403, f"token {caller.name!r} has scope {caller.scope!r}; apply needs 'write'")
    try:
        return await request.app.state.heavy.run(suggest, services, sweep_id, body, caller.name)
    except SuggestError as e:
        raise HTTPException(422, [{"loc": ["body", e.field], "msg": str(e), "type": "value_error"}]) from None
