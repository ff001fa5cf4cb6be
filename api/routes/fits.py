"""/fits and /decisions: fit a law on observations, read fits and their plots, decide upcycle or scratch (from the
newest analysis, or from two stored fits)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse

from upscale.api.routes.deps import AUTH_ERRORS, NOT_FOUND, Reader, ServicesDep, Writer, plot_url
from upscale.control import analyses, fits
from upscale.control.records import FitRecord
from upscale.control.schemas import DecisionPublic, ExpansionDecisionPublic, FitCreate, FitPublic
from upscale.fitting.errors import FitError
from upscale.fitting.laws import get_law
from upscale.orchestrator.errors import OrchestratorError

router = APIRouter(tags=["fits"], responses=AUTH_ERRORS)
# Its own router: a router's tags are added to each route's, and an operation with two tags is listed twice on /docs.
decisions = APIRouter(tags=["decisions"], responses=AUTH_ERRORS)
MAX_COUNT = 1e18  # tokens and parameters beyond this are typos, not budgets


def _public(record: FitRecord, request: Request) -> FitPublic:
    return FitPublic(id=record.id, law=record.law, kind=record.kind, owner=record.owner,
                     created_at=record.created_at, data_hash=record.data_hash, request=record.request,
                     report=record.report,
                     plots={p: plot_url(request, "fit_plot", fit_id=record.id, name=p) for p in record.plots})


@router.post("/fits", status_code=201, summary="Fit a law", response_model=FitPublic,
             responses={422: {"description": "Unknown law, missing columns, too few points, more inline rows or "
                                              "bootstrap refits than one request may make..."},
                        429: {"description": "The token made UPSCALE_MAX_FITS_PER_MINUTE fits in the last minute, "
                                             "or the server's heavy-request threads and queue are full "
                                             "(Retry-After says when to try again)."}})
async def create_fit(body: FitCreate, request: Request, services: ServicesDep, owner: Writer) -> FitPublic:
    """Huber/BFGS fit of `law` on the selected observations, with LOO RMS, bootstrap intervals over trunks when
    `bootstrap` > 0, and diagnostic plots. The fit is stored under the caller's token name and never changes; any
    write token may fit any sweep's observations (it only reads them). Its cost is bounded: at most 5000 inline rows,
    leave-one-out over a seeded sample of 200 rows above that many (`report.loo_sampled`), bootstrap draws x rows at
    most 250,000, and UPSCALE_MAX_FITS_PER_MINUTE fits per token per minute (429). It computes on the server's
    heavy-request threads (429 when they and their queue are full)."""
    request.app.state.fit_quota.take(owner.name)
    try:
        return _public(await request.app.state.heavy.run(fits.create_fit, services, body, owner.name), request)
    except (FitError, OrchestratorError) as e:
        raise RequestValidationError([_fit_problem(body, e)]) from None


def _fit_problem(body: FitCreate, e: ValueError) -> dict[str, object]:
    """A fit's failure as a 422 entry with its field path: an unknown law is `law`'s; anything else (a sweep the
    store lacks, missing columns, too few points) is about the data, `rows` or `sweep_ids`, whichever was given."""
    try:
        get_law(body.law)
        field, value = ("rows", None) if body.rows is not None else ("sweep_ids", body.sweep_ids)
    except FitError:
        field, value = "law", body.law
    return {"loc": ("body", field), "msg": str(e), "type": "fit", "input": value}


@router.get("/fits", summary="List fits", response_model=list[FitPublic])
def list_fits(request: Request, services: ServicesDep, _: Reader) -> list[FitPublic]:
    """Every stored fit of every owner, oldest first (a read token sees all)."""
    return [_public(r, request) for r in fits.list_fits(services)]


def _fit_or_404(services: ServicesDep, fit_id: str) -> FitRecord:
    record = fits.get_fit(services, fit_id)
    if record is None:
        raise HTTPException(404, f"no fit {fit_id!r}; GET /fits lists them")
    return record


@router.get("/fits/{fit_id}", summary="A fit", response_model=FitPublic, responses=NOT_FOUND)
def get_fit(fit_id: str, request: Request, services: ServicesDep, _: Reader) -> FitPublic:
    """Parameters, intervals, LOO RMS, the fitter's record (version, data hash) and plot links."""
    return _public(_fit_or_404(services, fit_id), request)


@router.get("/fits/{fit_id}/plots/{name}.png", summary="A fit's plot", response_class=FileResponse,
            responses={**NOT_FOUND, 200: {"content": {"image/png": {}}, "description": "The PNG."}})
def fit_plot(fit_id: str, name: str, services: ServicesDep, _: Reader) -> FileResponse:
    """One of the fit's diagnostic plots (parity, residuals, loss_vs_d or loss_vs_d2 and alpha_d1), as listed in its
    `plots`; a PDF of each sits beside it in the fit's folder."""
    if name not in _fit_or_404(services, fit_id).plots:
        raise HTTPException(404, f"fit {fit_id} has no plot {name!r}")
    return FileResponse(fits.fit_path(services.settings.home, fit_id) / f"{name}.png", media_type="image/png")


@decisions.get("/decisions/upcycle", summary="Upcycle or train from scratch?", response_model=DecisionPublic,
               responses={404: {"description": "No such sweep."},
                          409: {"description": "Nothing can answer yet, and what is missing: no sweep has finished "
                                "segments, the analysis is running or failed, or it has no law to answer with."},
                          422: {"description": "Bad values or an unknown group."}})
def decide_upcycle(services: ServicesDep, _: Reader,
                   n1: float = Query(ge=1, le=MAX_COUNT, description="Dense model size (parameters)."),
                   d1: float = Query(ge=1, le=MAX_COUNT, description="Tokens the dense model was trained on."),
                   d2: float = Query(ge=1, le=MAX_COUNT, description="Tokens you would spend on the upcycled MoE."),
                   sweep_id: str | None = Query(None, description="Answer from this sweep's newest analysis (default: "
                                                "the newest analysis of any sweep)."),
                   group: str | None = Query(None, description="Upcycling group as the analysis labels it, e.g. "
                                             "`naive 8x2` (default: the one predicting the lowest loss here).")
                   ) -> DecisionPublic:
    """The catch-up budget from scratch needs to match upcycling, the verdict (upcycle when it exceeds D1), its
    bootstrap probability, and D* at this N1. It answers from the newest finished analysis (which runs by itself
    when a sweep finishes) and names it with its age: one answer, one provenance (a fit stored by POST /fits is
    read at GET /fits/{id})."""
    return analyses.decision(services, n1, d1, d2, sweep_id, group)


@decisions.get("/decisions/expand", summary="Grow an MoE to more experts, or train the larger one from scratch?",
               response_model=ExpansionDecisionPublic,
               responses={404: {"description": "No such sweep."},
                          409: {"description": "Nothing can answer yet, and what is missing: no analysis, no "
                                "expansion study, or none with laws to answer with."},
                          422: {"description": "Bad values, an unknown study, or a point outside every study's sane "
                                "region."}})
def decide_expand(services: ServicesDep, _: Reader,
                  n1: float = Query(ge=1, le=MAX_COUNT, description="Dense size of the parent's shape (parameters), "
                                    "as the analysis's N1."),
                  d1: float = Query(ge=1, le=MAX_COUNT, description="Tokens the E-expert parent MoE was trained on."),
                  d2: float = Query(ge=1, le=MAX_COUNT, description="Tokens you would spend on the expanded MoE."),
                  sweep_id: str | None = Query(None, description="Answer from this sweep's newest analysis (default: "
                                               "the newest analysis of any sweep)."),
                  study: str | None = Query(None, description="Expansion study as the analysis labels it, e.g. "
                                            "`expand 4x1 -> 8x1 uniform` (default: the one predicting the lowest "
                                            "loss here).")
                  ) -> ExpansionDecisionPublic:
    """D*_expand and the verdict for expert upcycling: expand the parent (duplicated experts, top-K unchanged) and
    train it D2 tokens, or train the m·E-expert MoE from scratch, the parent's D1 tokens spent either way. Answered
    as /decisions/upcycle answers (the runs first, the weighed law forms, their reach), from the same newest
    analysis."""
    return analyses.expansion_decision(services, n1, d1, d2, sweep_id, study)
