"""The FastAPI control plane: `create_app(settings)` builds one app on one store, with the sweep loop, the refit loop
and the analysis loop running in background threads of the same process unless `scheduler=False` (`upscale serve
--no-scheduler`).

Errors a caller can fix come back as `{"detail": ...}`: a bad spec as 422 with one entry per problem whose `loc`
is the field path, a fitting problem as 422 with its message, a missing resource as 404, and nothing to answer
with yet (no observations, no analysis) as 409 saying what is missing; a submission while the Ray cluster is down is
a 503 saying so (it is being restarted: try again). Every error is small: a body over UPSCALE_MAX_BODY_BYTES is
refused with 413 before it is read whole (`BodyLimit`), and a message quotes at most an excerpt of a bad value.
A request's token is checked before its body is read, and its body must arrive within UPSCALE_BODY_TIMEOUT_S
(api/request_guards.py); heavy requests compute on threads of their own (api/heavy.py).

/docs (Swagger UI) and /redoc load their scripts and styles from the app itself (fastapi-offline's bundled copies),
so the pages render on a machine without internet, and their Content-Security-Policy keeps the browser from fetching
anything else (api/docs_pages.py). The schema's version is the package's.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import unquote_plus

from anyio import CapacityLimiter
from fastapi import Depends, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from upscale import __version__
from upscale.api.docs_pages import SameOriginDocs
from upscale.api.heavy import HeavyPool
from upscale.api.quotas import IN_FLIGHT_RETRY_S, PerMinute
from upscale.api.request_guards import AuthBeforeBody, BodyDeadline
from upscale.api.routes import analyses, calibration, fits, ops, refits, segments, sweeps, tokens
from upscale.api.routes.deps import known_ids
from upscale.control.analyses import AnalysisLoop, NotReady, stop_requested
from upscale.control.refits import RefitLoop
from upscale.control.sweep_loop import SweepLoop
from upscale.control.sweeps import TooManyInFlight
from upscale.control.wiring import open_services
from upscale.orchestrator.errors import ConflictError, NotFoundError
from upscale.orchestrator.infra import ClusterUnavailable
from upscale.orchestrator.settings import Settings
from upscale.sweeps.spec import SpecError, excerpt

log = logging.getLogger(__name__)
HEALTH_THREADS = 4  # /healthz's own threads (asking a RAY_ADDRESS cluster for its nodes may take a second)
DESCRIPTION = """Submit sweeps of upcycling experiments, watch them train, fit the scaling laws and ask whether to
upcycle a dense model or train the MoE from scratch. Every endpoint but /healthz, /metrics and these pages takes a
bearer token (`upscale token create --scope read|write|admin NAME`). A read token sees everything (a shared team
store); a write token also creates sweeps, fits, analyses and refit schedules, which its name owns, and changes only
those; an admin token changes anyone's."""


def _loc(path: str) -> list[str | int]:
    """SpecError's "tokens.d1[0]" as FastAPI's loc ["tokens", "d1", 0]; only ASCII digits are an index (a key may be
    "²" or "١", which str.isdigit calls digits and int() refuses or reads as another number)."""
    return [int(p) if p.isascii() and p.isdigit() else p for p in re.findall(r"[^.\[\]]+", path)]


async def _spec_error(_: Request, e: SpecError) -> JSONResponse:
    detail = [{"loc": ["body", *_loc(path)], "msg": msg, "type": "spec"} for path, msg in e.problems]
    return JSONResponse({"detail": detail}, status_code=422)


async def _request_validation_error(_: Request, e: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 for a body or parameter that fails its model, with each bad value quoted as an excerpt: the
    default echoes the whole value (a megabyte of a body that is not JSON)."""
    detail = [{"loc": err["loc"], "msg": err["msg"], "type": err["type"], "input": excerpt(err.get("input"))}
              for err in e.errors()]
    return JSONResponse({"detail": jsonable_encoder(detail)}, status_code=422)


class BodyLimit:
    """413 for a request body over ``max_bytes``, before it is read whole: a Content-Length over the limit is
    refused at once, and a streamed (chunked) body as soon as the bytes received pass it. The overflow is raised as
    an HTTPException from `receive`, which FastAPI's body parsing re-raises as it is."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    def _too_large(self) -> HTTPException:
        return HTTPException(413, f"request body larger than {self.max_bytes} bytes (UPSCALE_MAX_BODY_BYTES)")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_bytes:
            e = self._too_large()
            await JSONResponse({"detail": e.detail}, status_code=413)(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise self._too_large()
            return message

        await self.app(scope, limited, send)


class RefuseNul:
    """422 for a NUL character anywhere in a request's query or body (JSON's escaped `\\u0000` or a raw byte), 404
    in its path, before any route reads it: no id, name or value of upscale holds one, and PostgreSQL refuses one in
    a text parameter with an error. A body is checked as it arrives, its chunks kept until the last (BodyLimit,
    outside this, bounds them); a NUL is raised from `receive`, as BodyLimit's overflow is."""

    NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")  # \u0000 after an even run of backslashes

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        where = ("path" if "\x00" in scope["path"] else
                 "query" if "\x00" in unquote_plus(scope["query_string"].decode("latin-1")) else None)
        if where is not None:
            status = 404 if where == "path" else 422
            detail = ("no resource has a NUL character in its path" if where == "path" else
                      [{"loc": ["query"], "msg": "a NUL character is not allowed in a query", "type": "nul"}])
            await JSONResponse({"detail": detail}, status_code=status)(scope, receive, send)
            return
        body = bytearray()

        async def checked() -> Message:
            message = await receive()
            body.extend(message.get("body", b""))
            if not message.get("more_body") and (b"\x00" in body or self.NUL_ESCAPE.search(body)):
                raise HTTPException(422, [{"loc": ["body"], "msg": "a NUL character (\\u0000) is not allowed in a "
                                                                   "request body", "type": "nul"}])
            return message

        await self.app(scope, checked, send)


async def _http_error(request: Request, e: HTTPException) -> Response:
    """FastAPI's own answer, except for a JSON body nested past what the parser can recurse through: FastAPI turns
    that RecursionError into a bare 400 "error parsing the body"; it is a malformed body, 422 at `body`."""
    if isinstance(e.__cause__, RecursionError):
        return JSONResponse({"detail": [{"loc": ["body"], "msg": "JSON nested too deep to read", "type": "depth"}]},
                            status_code=422)
    return await http_exception_handler(request, e)


def _raised_by_upscale(e: BaseException) -> bool:
    """Whether the innermost frame of ``e``'s traceback is upscale's own code (its messages are written for users)."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is None or tb.tb_frame.f_globals.get("__name__", "").startswith("upscale.")


async def _value_error(request: Request, e: ValueError) -> JSONResponse:
    """A user error (FitError, the orchestrator's value errors, our own checks) with its message. A ValueError a
    library raised (numpy's "Geometric sequence cannot include zero") says nothing a caller can act on, and its text
    is an internal's: the answer names the route instead, and the log keeps the message."""
    if _raised_by_upscale(e):
        return JSONResponse({"detail": str(e)}, status_code=422)
    log.warning("%s %s: %s: %s", request.method, request.url.path, type(e).__name__, e)
    return JSONResponse({"detail": "a value in this request is outside what upscale can compute with: check that "
                                   "every count, size and budget is within the bounds the API documents"},
                        status_code=422)


Handler = Callable[[Request, Exception], Awaitable[JSONResponse]]


def _answer(status: int, headers: dict[str, str] | None = None) -> Handler:
    """A handler answering ``status`` with the exception's message as the detail, as HTTPException(status, message)
    would have."""
    async def handler(_: Request, e: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(e)}, status_code=status, headers=headers)

    return handler


def _add_spec_schemas(app: FastAPI) -> None:
    """Add the sweep spec's models to the OpenAPI components: POST /sweeps reads its body raw (JSON or YAML), so
    FastAPI does not collect the schema the route documents."""
    base = app.openapi

    def openapi() -> dict[str, Any]:
        schema = base()  # FastAPI's, built once and cached on the app
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        clashes = [name for name, s in sweeps.SPEC_COMPONENTS.items() if components.get(name, s) != s]
        if clashes:
            raise RuntimeError(f"API and sweep spec models share the component names {clashes}: rename one")
        components.update(sweeps.SPEC_COMPONENTS)
        return schema

    app.openapi = openapi


def create_app(settings: Settings, *, auth: bool = True, scheduler: bool = True, refit_tick_s: float = 5.0,
               poll_s: float = 1.0, analysis_tick_s: float = 5.0) -> FastAPI:
    """The app on ``settings``' store; its lifespan starts and gracefully stops the background loops."""
    services = open_services(settings, auth=auth)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if scheduler:
            app.state.loops = (SweepLoop(services, poll_s=poll_s), RefitLoop(services, tick_s=refit_tick_s),
                               AnalysisLoop(services, tick_s=analysis_tick_s))
            for loop in app.state.loops:
                loop.start()
        yield
        app.state.heavy.shutdown()
        stop_requested(services)  # analyses in flight end `failed`, interrupted: the next start reruns them
        if app.state.loops:
            for loop in app.state.loops:
                loop.stop()

    # validatorUrl None: Swagger UI would otherwise send the schema to an online validator for its badge.
    app = FastAPIOffline(title="upscale", version=__version__, description=DESCRIPTION, lifespan=lifespan,
                         swagger_ui_parameters={"validatorUrl": None})
    app.state.services, app.state.loops = services, None
    app.state.heavy = HeavyPool(settings.heavy_workers, settings.heavy_queue, settings.heavy_wait_s)  # api/heavy.py
    app.state.health_threads = CapacityLimiter(HEALTH_THREADS)  # /healthz never waits behind other requests
    app.state.fit_quota = PerMinute("fits", settings.max_fits_per_minute, "UPSCALE_MAX_FITS_PER_MINUTE")
    app.state.analysis_quota = PerMinute("analyses", settings.max_analyses_per_minute,
                                         "UPSCALE_MAX_ANALYSES_PER_MINUTE")
    app.add_exception_handler(SpecError, _spec_error)
    app.add_exception_handler(RequestValidationError, _request_validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(ValueError, _value_error)  # FitError and the orchestrator's value errors
    # The store has no such resource (a subclass of ValueError: the closer handler wins).
    app.add_exception_handler(NotFoundError, _answer(404))
    # Nothing can answer yet (no observations, no analysis, one running): what is missing.
    app.add_exception_handler(NotReady, _answer(409))
    # The state forbids it now (a segment running): what to wait for or do first.
    app.add_exception_handler(ConflictError, _answer(409))
    # The token has its quota of sweeps in flight, counted where a sweep is recorded (control/sweeps.py).
    app.add_exception_handler(TooManyInFlight, _answer(429, {"Retry-After": str(IN_FLIGHT_RETRY_S)}))
    # Ray is down (being restarted): say so and to try again, not a 422 blaming the spec.
    app.add_exception_handler(ClusterUnavailable, _answer(503, {"Retry-After": "30"}))
    for router in (sweeps.router, calibration.router, analyses.router, fits.router, fits.decisions, refits.router,
                   segments.router, tokens.router):
        app.include_router(router, dependencies=[Depends(known_ids)])
    app.include_router(ops.router)  # /healthz and /metrics: no token, no ids
    app.add_middleware(RefuseNul)
    app.add_middleware(SameOriginDocs)
    app.add_middleware(AuthBeforeBody)  # no body is read from a caller without a valid token
    app.add_middleware(BodyDeadline, seconds=settings.body_timeout_s)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)  # the outermost: RefuseNul keeps what it lets in
    _add_spec_schemas(app)
    return app
