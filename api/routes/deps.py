"""Annotated dependency aliases the routes share (the FastAPI template's `StoreDep` pattern)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request

from api.auth import require
from api.services import Services
from orchestrator.errors import OrchestratorError
from orchestrator.records import SweepRecord


def get_services(request: Request) -> Services:
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(get_services)]
Reader = Annotated[str, Depends(require("read"))]
Writer = Annotated[str, Depends(require("write"))]
AUTH_ERRORS = {401: {"description": "Missing or unknown bearer token."},
               403: {"description": "The token's scope does not allow this."}}
NOT_FOUND = {404: {"description": "No such resource."}}


def sweep_or_404(services: Services, sweep_id: str) -> SweepRecord:
    try:
        return services.store.sweep(sweep_id)
    except OrchestratorError as e:
        raise HTTPException(404, str(e)) from None
