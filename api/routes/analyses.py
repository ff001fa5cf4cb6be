"""/sweeps/{id}/analysis and /analyses: run the paper's analysis on a sweep, read the latest one, its history and
its plots (control/analyses.py)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.responses import FileResponse

from upscale.api.auth import check_modify
from upscale.api.routes.deps import AUTH_ERRORS, Reader, ServicesDep, Writer, plot_url
from upscale.control import analyses, sweeps
from upscale.control.analysis_jobs import TooManyAnalyses
from upscale.control.records import AnalysisRecord
from upscale.control.schemas import AnalysisCreate, AnalysisPublic

router = APIRouter(tags=["analyses"], responses=AUTH_ERRORS)
UNKNOWN_SWEEP = {404: {"description": "No such sweep."}}
PLOT_TYPES = {".png": "image/png", ".pdf": "application/pdf"}


def _public(record: AnalysisRecord, request: Request) -> AnalysisPublic:
    sweep = record.sweep_ids[0] if record.sweep_ids else None
    plots = ({p: plot_url(request, "analysis_plot", sweep_id=sweep, name=f"{p}.png")
              + f"?analysis_id={record.id}" for p in record.plots} if sweep else {})
    return analyses.public(record, plots)


@router.post("/sweeps/{sweep_id}/analysis", status_code=202, summary="Analyse a sweep now",
             response_model=AnalysisPublic,
             responses={200: {"model": AnalysisPublic, "description": "These observations were already analysed with "
                              "these parameters: that analysis, unchanged."},
                        **UNKNOWN_SWEEP,
                        409: {"description": "The sweep has no finished segments yet, or the analysis of these "
                              "inputs is running: the message names it, and `Location` is where to poll."},
                        422: {"description": "A bad parameter."},
                        429: {"description": "The caller has as many requested analyses running as one token name "
                              "may."}})
def create_analysis(sweep_id: str, body: AnalysisCreate, request: Request, response: Response,
                    services: ServicesDep, caller: Writer) -> AnalysisPublic:
    """Start the paper's analysis of the sweep's observations and answer at once (202, status `running`; poll
    `Location`, GET /analyses/{id}, until `done` or `failed`): the from-scratch MoE law, E shared with the dense
    law, the upcycled law per upcycling group (method, r, n_expert x topk), D* at each N1 with its bootstrap
    interval and closed form, verdicts, and the plots. Laws the grid cannot identify are not fitted:
    `analysis.problems` says which, why and what to add. The service also runs it by itself when a sweep finishes
    or its observations change (UPSCALE_ANALYSIS_POLICY), so this is for other parameters or for running it now.
    Identical inputs (observations and parameters) make one analysis: 200 with it when it is done, 409 naming it
    while it runs; a failed one runs again. Each token name may have a few requested analyses running at once (429
    past that). Only the sweep's owner or an admin token may run it (403 otherwise): the analysis it records
    becomes the one the sweep's decisions answer from."""
    check_modify(caller, sweeps.owner_of(services, sweep_id), f"sweep {sweep_id}")
    request.app.state.analysis_quota.take(caller.name)  # 429 past UPSCALE_MAX_ANALYSES_PER_MINUTE
    try:
        record = analyses.request_analysis(services, sweep_id, n1s=body.n1s, bootstrap=body.bootstrap,
                                           seed=body.seed, owner=caller.name, jobs=services.jobs,
                                           curves=body.curves)
    except analyses.AnalysisRunning as e:
        raise HTTPException(409, str(e), headers={"Location": _where(e.record, request)}) from None
    except TooManyAnalyses as e:
        raise HTTPException(429, str(e)) from None
    if record.ran:
        response.headers["Location"] = _where(record, request)
    else:
        response.status_code = 200
    return _public(record, request)


def _where(record: AnalysisRecord, request: Request) -> str:
    return request.app.url_path_for("get_analysis_by_id", analysis_id=record.id)


@router.get("/analyses/{analysis_id}", summary="One analysis", response_model=AnalysisPublic,
            responses={404: {"description": "No such analysis."}})
def get_analysis_by_id(analysis_id: str, request: Request, services: ServicesDep, _: Reader) -> AnalysisPublic:
    """An analysis in whatever state it is: `running`, `done` with its record and plots, or `failed` with its
    error (one starting "interrupted" was cut short by a server stopping, and runs again by itself)."""
    with services.store.transaction() as s:
        record = s.get(AnalysisRecord, analysis_id)
    if record is None:
        raise HTTPException(404, f"no analysis {analysis_id!r}")
    return _public(record, request)


def _latest(services: ServicesDep, sweep_id: str) -> AnalysisRecord:
    services.store.sweep(sweep_id)  # 404 for an unknown sweep
    record = analyses.latest_analysis(services.store, sweep_id)
    if record is None:
        raise analyses.NotReady(analyses.why_no_analysis(services, sweep_id))
    return record


@router.get("/sweeps/{sweep_id}/analysis", summary="A sweep's latest analysis", response_model=AnalysisPublic,
            responses={**UNKNOWN_SWEEP, 409: {"description": "No finished analysis yet, and why: no finished "
                                              "segments, it is running, or it failed."}})
def get_analysis(sweep_id: str, request: Request, services: ServicesDep, _: Reader) -> AnalysisPublic:
    """The newest finished analysis that includes this sweep: fits with intervals, D* per N1, verdicts, problems and
    plot links. It runs by itself when the sweep finishes; POST to this path runs it now."""
    return _public(_latest(services, sweep_id), request)


@router.get("/sweeps/{sweep_id}/analyses", summary="A sweep's analyses", response_model=list[AnalysisPublic],
            responses=UNKNOWN_SWEEP)
def list_sweep_analyses(sweep_id: str, request: Request, services: ServicesDep, _: Reader) -> list[AnalysisPublic]:
    """Every analysis that includes this sweep, newest first, running and failed ones too (with their error)."""
    services.store.sweep(sweep_id)
    return [_public(r, request) for r in analyses.analyses(services.store, sweep_id)]


@router.get("/analyses", summary="List analyses", response_model=list[AnalysisPublic])
def list_analyses(request: Request, services: ServicesDep, _: Reader,
                  status: str | None = Query(None, description="Only analyses in this state: running, done or "
                                             "failed.")) -> list[AnalysisPublic]:
    """Every analysis of every sweep (and the demo's), newest first."""
    return [_public(r, request) for r in analyses.analyses(services.store) if status in (None, r.status)]


@router.get("/sweeps/{sweep_id}/analysis/plots/{name:path}", summary="A plot of a sweep's analysis",
            response_class=FileResponse,
            responses={200: {"content": {"image/png": {}, "application/pdf": {}}, "description": "The PNG or PDF."},
                       404: {"description": "No such sweep, analysis or plot."},
                       409: {"description": "No finished analysis yet."}})
def analysis_plot(sweep_id: str, name: str, services: ServicesDep, _: Reader,
                  analysis_id: str | None = Query(None, description="Which analysis (default: the latest).")
                  ) -> FileResponse:
    """One plot of the analysis as listed in its `plots`, `NAME.png` or `NAME.pdf` (names may hold a group's folder,
    e.g. `naive_8x2/catch_up.png`). Only listed names are served."""
    if analysis_id is None:
        record = _latest(services, sweep_id)
    else:
        with services.store.transaction() as s:
            record = s.get(AnalysisRecord, analysis_id)
        if record is None or sweep_id not in record.sweep_ids:
            raise HTTPException(404, f"sweep {sweep_id} has no analysis {analysis_id!r}")
    stem, dot, suffix = name.rpartition(".")
    if not dot or f".{suffix}" not in PLOT_TYPES or stem not in record.plots:
        raise HTTPException(404, f"analysis {record.id} has no plot {name!r}; it has "
                                 f"{', '.join(f'{p}.png' for p in record.plots) or 'none'}")
    path = analyses.analysis_dir(services.settings.home, record.id) / name  # a listed name: no way out of the folder
    return FileResponse(path, media_type=PLOT_TYPES[f".{suffix}"])
