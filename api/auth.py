"""Bearer tokens on HTTP: the principal a request acts as (control/tokens.py holds the tokens and the rules).

Routes receive a `Principal` through api/routes/deps.py's Reader/Writer/Admin, and check ownership with
`check_modify` only.
"""

from __future__ import annotations

from fastapi import HTTPException, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from upscale.control.services import Services
from upscale.control.tokens import LOCAL, Principal, Scope, lookup

_bearer = HTTPBearer(auto_error=False, description="`upscale token create --scope read|write|admin NAME` prints one.")


def check_modify(caller: Principal, owner: str, what: str) -> None:
    """403 unless ``caller`` `can_modify(owner)`; ``what`` names the resource, e.g. "sweep 3f9c2a1b7d04"."""
    if not caller.can_modify(owner):
        raise HTTPException(403, f"{what} belongs to {owner!r}: a write token changes only what its own name "
                                 f"owns (token {caller.name!r}); an admin token changes anything")


def authorize(services: Services, token: str | None, scope: Scope) -> Principal:
    """The principal of ``token`` (None: none was sent) if it may act at ``scope``: 401 without a valid token
    (unknown, revoked or expired), 403 if its scope is too small. Anyone, as LOCAL, where auth is off."""
    if not services.auth:
        return LOCAL
    found = lookup(services.store, token) if token else None
    if found is None:
        raise HTTPException(401, "missing, unknown, revoked or expired bearer token",
                            headers={"WWW-Authenticate": "Bearer"})
    if not found.has(scope):
        raise HTTPException(403, f"token {found.name!r} has scope {found.scope!r}; this needs {scope!r}")
    return found


def require(scope: Scope):
    """A dependency that returns the caller's Principal (`authorize`). It carries its ``scope`` as `required_scope`,
    so api/request_guards.py can check a request's token before its body is read."""

    def dependency(request: Request, cred: HTTPAuthorizationCredentials | None = Security(_bearer)) -> Principal:
        return authorize(request.app.state.services, cred.credentials if cred else None, scope)

    dependency.required_scope = scope  # type: ignore[attr-defined]
    return dependency
