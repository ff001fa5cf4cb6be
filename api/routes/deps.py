"""Annotated dependency aliases the routes share (the FastAPI template's `StoreDep` pattern).

Reader, Writer and Admin give a route the caller's `Principal` (api/auth.py) once its scope is enough; a route that
changes something someone owns calls `principal.check_modify(owner, what)`, so the ownership rule lives in one place.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from upscale.api.auth import Principal, require
from upscale.control.services import Services


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
