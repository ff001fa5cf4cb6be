"""Bodies only the HTTP face returns: liveness and the bearer tokens (api/auth.py). What the routes share with the CLI
and the background loops, requests and results alike, is the control layer's (control/schemas.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from upscale.control.schemas import Timestamp


class TokenPublic(BaseModel):
    """A bearer token as `upscale token list` shows it: never the token or its hash."""

    id: str
    name: str = Field(description="Its principal: the owner of what it creates.")
    scope: Literal["read", "write", "admin"]
    created_at: Timestamp
    expires_at: Timestamp | None = Field(description="Refused from then on; null: never expires.")
    revoked_at: Timestamp | None = Field(description="When it was revoked; null: not revoked.")
    state: Literal["active", "expired", "revoked"]


class Health(BaseModel):
    status: Literal["ok"]
    scheduler: bool = Field(description="Whether this process runs the sweep and refit schedulers.")
