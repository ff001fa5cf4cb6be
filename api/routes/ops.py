"""/healthz and /metrics: for load balancers and Prometheus, so neither needs a token. /healthz is supervision's
report (control/supervised.py): each background loop's liveness and Ray's health, 503 when any is down."""

from __future__ import annotations

from anyio import to_thread
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from upscale.api.metrics import render
from upscale.api.routes.deps import ServicesDep
from upscale.api.schemas import Health
from upscale.control.sweep_loop import ray_health

router = APIRouter(tags=["operations"])


@router.get("/healthz", summary="Liveness", response_model=Health,
            responses={503: {"model": Health, "description": "A background loop is dead or stuck, or Ray is down."}})
async def healthz(request: Request) -> Health | JSONResponse:
    """200 while the process serves and, where it runs the schedulers, each loop lives and Ray is up; otherwise 503
    with the same body saying what is down. Cheap: it never waits on a dead Ray (`ray_problem`). Its probe runs on
    threads of its own (asking a RAY_ADDRESS cluster may take a second), so it never waits behind other requests."""
    loops = request.app.state.loops
    if loops is None:
        return Health(status="ok", scheduler=False)
    ray = await to_thread.run_sync(ray_health, request.app.state.services.settings,
                                   limiter=request.app.state.health_threads)
    health = Health(status="ok", scheduler=True, loops={loop.name: loop.health() for loop in loops}, ray=ray)
    if health.ray is None and all(loop.ok for loop in health.loops.values()):
        return health
    health.status = "unavailable"
    return JSONResponse(health.model_dump(mode="json"), status_code=503)


@router.get("/metrics", summary="Prometheus metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format."}})
def metrics(services: ServicesDep) -> Response:
    """upscale_segments{state}, upscale_queue_length, upscale_refit_age_seconds."""
    return Response(render(services), media_type=CONTENT_TYPE_LATEST)
