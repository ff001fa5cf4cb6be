"""Bearer tokens: created once and shown once, stored as their sha256, with a scope (`read`, or `write` which also
reads). Routes depend on `require("read")` or `require("write")`; the token's name becomes a sweep's owner."""

from __future__ import annotations

import hashlib
import secrets
import time
import uuid
from typing import Literal

from fastapi import HTTPException, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import select

from upscale.api.records import TokenRecord
from upscale.api.services import Services
from upscale.orchestrator.store import Store

Scope = Literal["read", "write"]
CACHE_S = 10.0  # a new token works at once; a token's scope is fixed, so a cached answer stays right
LOCAL_OWNER = "local"  # the owner of what in-process CLI calls create (they hold the database itself)
_bearer = HTTPBearer(auto_error=False, description="`upscale token create --scope read|write` prints one.")


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(store: Store, scope: Scope, name: str) -> str:
    """A new random token of ``scope``; returns the plain token, which is not stored anywhere."""
    token = f"ups_{secrets.token_urlsafe(24)}"
    with store.transaction() as s:
        s.add(TokenRecord(id=uuid.uuid4().hex[:12], name=name, token_hash=digest(token), scope=scope))
    return token


def lookup(store: Store, token: str) -> TokenRecord | None:
    with store.transaction() as s:
        return s.scalar(select(TokenRecord).where(TokenRecord.token_hash == digest(token)))


def caller(services: Services, token: str) -> tuple[str, str] | None:
    """(name, scope) of a valid token, remembered for CACHE_S: every request is authenticated, most by the same
    few tokens, and the lookup would otherwise be a transaction per request. Unknown tokens are not remembered (a
    flood of random ones must not grow the cache)."""
    now = time.monotonic()
    hit = services.token_cache.get(token)
    if hit is not None and hit[1] >= now:
        return hit[0]
    record = lookup(services.store, token)
    if record is None:
        return None
    services.token_cache[token] = ((record.name, record.scope), now + CACHE_S)
    return record.name, record.scope


def require(scope: Scope):
    """A dependency that returns the caller's name: 401 without a valid token, 403 if its scope is too small."""

    def dependency(request: Request, cred: HTTPAuthorizationCredentials | None = Security(_bearer)) -> str:
        services = request.app.state.services
        if not services.auth:
            return LOCAL_OWNER
        found = caller(services, cred.credentials) if cred else None
        if found is None:
            raise HTTPException(401, "missing or unknown bearer token", headers={"WWW-Authenticate": "Bearer"})
        name, has = found
        if scope == "write" and has != "write":
            raise HTTPException(403, f"token {name!r} has scope {has!r}; this needs 'write'")
        return name

    return dependency
