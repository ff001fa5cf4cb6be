"""/tokens: an admin token lists every bearer token and revokes one (what `upscale token list` and `upscale token
revoke` do on the store's machine); tokens are created only there, by whoever holds the database."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from upscale.api.routes.deps import AUTH_ERRORS, NOT_FOUND, Admin, ServicesDep
from upscale.api.schemas import TokenPublic
from upscale.control import tokens
from upscale.control.records import TokenRecord

router = APIRouter(tags=["tokens"], responses=AUTH_ERRORS)


def _public(record: TokenRecord) -> TokenPublic:
    return TokenPublic(id=record.id, name=record.name, scope=record.scope, created_at=record.created_at,
                       expires_at=record.expires_at, revoked_at=record.revoked_at, state=tokens.state(record))


@router.get("/tokens", summary="List tokens (admin)", response_model=list[TokenPublic])
def list_tokens(services: ServicesDep, _: Admin) -> list[TokenPublic]:
    """Every token's name, id, scope, creation, expiry and state, oldest first; never the token itself."""
    return [_public(r) for r in tokens.tokens(services.store)]


@router.delete("/tokens/{token_id}", summary="Revoke a token (admin)", response_model=TokenPublic,
               responses=NOT_FOUND)
def revoke_token(token_id: str, services: ServicesDep, _: Admin) -> TokenPublic:
    """Revoke one token by id: every server on the store refuses it from the next request on. Revoking a revoked
    token keeps its first revocation time."""
    if tokens.token(services.store, token_id) is None:
        raise HTTPException(404, f"no token with id {token_id!r}; GET /tokens lists them")
    tokens.revoke(services.store, token_id, by_name=False)
    return _public(tokens.token(services.store, token_id))
