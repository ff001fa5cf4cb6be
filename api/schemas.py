"""Bodies only the HTTP face returns: liveness and the bearer tokens (control/tokens.py). What the routes share with
the CLI and the background loops, requests and results alike, is the control layer's (control/schemas.py)."""

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


class LoopHealth(BaseModel):
    """One background loop of the server (control/supervised.py)."""

    ok: bool = Field(description="Its thread runs and has shown progress lately.")
    problem: str | None = Field(description="Why it is not ok: its thread died, or it is stuck; null when ok.")
    alive: bool
    last_progress_s_ago: float = Field(description="Seconds since it last finished an iteration or made progress.")
    consecutive_failures: int = Field(description="Iterations in a row that raised; each is retried with a backoff.")
    last_error: str | None = Field(description="The type of the last iteration's error while failures continue (the "
                                               "server's log has its message and traceback).")


class Health(BaseModel):
    """200 with status ok, or 503 with status unavailable and this same body saying what is down."""

    status: Literal["ok", "unavailable"]
    scheduler: bool = Field(description="Whether this process runs the sweep and refit schedulers.")
    loops: dict[str, LoopHealth] = Field(default_factory=dict, description="Each background loop, by name.")
    ray: str | None = Field(None, description="What is wrong with the Ray cluster sweeps run on; null when it is up "
                                              "or this process runs no scheduler.")
