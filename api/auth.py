"""Bearer tokens: created once and shown once, stored as their sha256, with a scope (`read`, or `write` which also
reads). Routes depend on `require("read")` or `require("write")`; the token's name becomes a sweep's owner."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from typing import Literal

from fastapi import HTTPException, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import select

from api.records import TokenRecord
from orchestrator.store import Store

Scope = Literal["read", "write"]
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


def require(scope: Scope):
    """A dependency that returns the caller's name: 401 without a valid token, 403 if its scope is too small."""

    def dependency(request: Request, cred: HTTPAuthorizationCredentials | None = Security(_bearer)) -> str:
        services = request.app.state.services
        if not services.auth:
            return LOCAL_OWNER
        record = lookup(services.store, cred.credentials) if cred else None
        if record is None:
            raise HTTPException(401, "missing or unknown bearer token", headers={"WWW-Authenticate": "Bearer"})
        if scope == "write" and record.scope != "write":
            raise HTTPException(403, f"token {record.name!r} has scope {record.scope!r}; this needs 'write'")
        return record.name

    return dependency
