"""Annotated dependency aliases the routes share (the FastAPI template's `StoreDep` pattern)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from upscale.api.auth import require
from upscale.api.services import Services


def get_services(request: Request) -> Services:
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(get_services)]
Reader = Annotated[str, Depends(require("read"))]
Writer = Annotated[str, Depends(require("write"))]
AUTH_ERRORS = {401: {"description": "Missing or unknown bearer token."},
               403: {"description": "The token's scope does not allow this."}}
# An unknown sweep id raises the store's NotFoundError, which api/app.py maps to 404 for every route.
NOT_FOUND = {404: {"description": "No such resource."}}
