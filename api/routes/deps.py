"""Annotated dependency aliases the routes share (the FastAPI template's `StoreDep` pattern).

Reader, Writer and Admin give a route the caller's `Principal` (control/tokens.py, checked by api/auth.py) once its
scope is enough; a route that changes something someone owns calls api/auth.py `check_modify(principal, owner,
what)`, so the ownership rule lives in one place.
`known_ids` guards every router that names ids (api/app.py adds it): an id no row can have is a 404 before the
database sees it. `plot_url` is how a response links a plot: a path on this server, never built from the request's
Host header (which a client chooses).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request

from upscale.api.auth import require
from upscale.control.services import Services
from upscale.control.tokens import Principal
from upscale.sweeps.spec import excerpt


def get_services(request: Request) -> Services:
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(get_services)]
Reader = Annotated[Principal, Depends(require("read"))]
Writer = Annotated[Principal, Depends(require("write"))]
Admin = Annotated[Principal, Depends(require("admin"))]
AUTH_ERRORS = {401: {"description": "Missing, unknown, revoked or expired bearer token."},
               403: {"description": "The token's scope does not allow this, or (a write token) the resource belongs "
                                    "to another name."}}
# An unknown sweep id raises the store's NotFoundError, which api/app.py maps to 404 for every route.
NOT_FOUND = {404: {"description": "No such resource."}}

# Every id the store makes is uuid4().hex[:12]; path and query parameters of these names hold one, and what lists them.
ID = re.compile(r"[0-9a-f]{12}")
IDS = {"sweep_id": ("sweep", "GET /sweeps"), "fit_id": ("fit", "GET /fits"),
       "analysis_id": ("analysis", "GET /analyses"), "schedule_id": ("refit schedule", "GET /refit-schedules"),
       "token_id": ("token", "GET /tokens")}


def known_ids(request: Request, _: Reader) -> None:
    """404 for a path or query id that is not 12 lowercase hex digits (a NUL byte or a name included): no row has
    it, and PostgreSQL refuses NUL in a text parameter with an error instead of an empty answer. After the token
    check, so an unauthenticated caller learns nothing of ids."""
    for name, value in [*request.path_params.items(), *request.query_params.multi_items()]:
        if name in IDS and not ID.fullmatch(value):
            what, listing = IDS[name]
            raise HTTPException(404, f"no {what} {excerpt(value)}; {listing} lists them")


def json_example(value: Any) -> dict[str, Any]:
    """A response's JSON example (for a route's `responses`): a real body instead of the one Swagger UI makes up
    (`additionalProp1`)."""
    return {"content": {"application/json": {"example": value}}}


def plot_url(request: Request, route: str, **params: Any) -> str:
    """The absolute path of a plot route on this server, under the root path it is served at (uvicorn's
    --root-path), with no scheme or host."""
    return request.scope.get("root_path", "") + str(request.app.url_path_for(route, **params))
