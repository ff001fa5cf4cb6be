"""/healthz and /metrics: for load balancers and Prometheus, so neither needs a token."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from upscale.api.metrics import render
from upscale.api.routes.deps import ServicesDep
from upscale.api.schemas import Health

router = APIRouter(tags=["operations"])


@router.get("/healthz", summary="Liveness", response_model=Health)
def healthz(request: Request) -> Health:
    """200 while the process serves; says whether it also runs the schedulers."""
    return Health(status="ok", scheduler=request.app.state.loops is not None)


@router.get("/metrics", summary="Prometheus metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format."}})
def metrics(services: ServicesDep) -> Response:
    """upscale_segments{state}, upscale_queue_length, upscale_refit_age_seconds."""
    return Response(render(services), media_type=CONTENT_TYPE_LATEST)
