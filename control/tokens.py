"""Bearer tokens and the principal a caller acts as: what both faces share. The routes check a request's token
(api/auth.py); the CLI creates, lists and revokes tokens in-process (`upscale token`).

A token is created once and shown once, stored as its sha256, with a name (its principal: the owner of what it
creates) and a scope: `read` sees everything (a shared team store), `write` also creates and changes what its
principal owns, `admin` changes what anyone owns. A token may expire (`expires_at`) and may be revoked
(`revoked_at`); both are read from the store on every lookup, so a revoked or expired token is refused at once by
every server sharing the store.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from sqlalchemy import bindparam, select, update

from upscale.control.records import TokenRecord
from upscale.control.services import LOCAL_OWNER
from upscale.orchestrator.clock import as_utc, utcnow
from upscale.orchestrator.store import Store

Scope = Literal["read", "write", "admin"]
SCOPES: tuple[Scope, ...] = ("read", "write", "admin")  # each implies the ones before it


@dataclass(frozen=True)
class Principal:
    """Who a request acts as: a token's name and scope."""

    name: str
    scope: Scope

    def has(self, scope: Scope) -> bool:
        return SCOPES.index(self.scope) >= SCOPES.index(scope)

    def can_modify(self, owner: str) -> bool:
        """A write token changes what its own name owns; an admin token changes anything."""
        return self.has("admin") or (self.has("write") and owner == self.name)


LOCAL = Principal(LOCAL_OWNER, "admin")  # the in-process CLI holds the database itself


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(store: Store, scope: Scope, name: str, expires_at: datetime | None = None) -> str:
    """A new random token of ``scope`` for ``name``, refused from ``expires_at`` on (None: never); returns the plain
    token, which is not stored anywhere."""
    token = f"ups_{secrets.token_urlsafe(24)}"
    with store.transaction() as s:
        s.add(TokenRecord(id=uuid.uuid4().hex[:12], name=name, token_hash=digest(token), scope=scope,
                          expires_at=expires_at))
    return token


def expiry(days: float | None) -> datetime | None:
    """The `expires_at` of a token that lives ``days`` from now (None: forever)."""
    return None if days is None else utcnow() + timedelta(days=days)


def tokens(store: Store) -> list[TokenRecord]:
    """Every token, oldest first (hashes included: callers show the rest)."""
    with store.transaction() as s:
        return list(s.scalars(select(TokenRecord).order_by(TokenRecord.created_at, TokenRecord.id)))


def token(store: Store, token_id: str) -> TokenRecord | None:
    with store.transaction() as s:
        return s.get(TokenRecord, token_id)


def revoke(store: Store, name_or_id: str, by_name: bool = True) -> list[str]:
    """Revoke the token with id ``name_or_id``, or else (``by_name``) every token of that name; returns the ids
    revoked now (tokens already revoked keep their time)."""
    with store.transaction() as s:
        by_id = s.scalar(select(TokenRecord.id).where(TokenRecord.id == name_or_id))
        match = TokenRecord.name == name_or_id if by_name and by_id is None else TokenRecord.id == name_or_id
        ids = list(s.scalars(select(TokenRecord.id).where(match, TokenRecord.revoked_at.is_(None))))
        if ids:
            s.execute(update(TokenRecord).where(TokenRecord.id.in_(ids)).values(revoked_at=utcnow()))
    return ids


def state(record: TokenRecord, now: datetime | None = None) -> str:
    """`active`, `revoked` or `expired`."""
    now = now or utcnow()
    if record.revoked_at is not None:
        return "revoked"
    if record.expires_at is not None and as_utc(record.expires_at) <= now:
        return "expired"
    return "active"


# Built once: constructing the select on every request cost five times the query itself (bench/api_load.py).
_LOOKUP = (select(TokenRecord.name, TokenRecord.scope, TokenRecord.expires_at)
           .where(TokenRecord.token_hash == bindparam("token_hash"), TokenRecord.revoked_at.is_(None)))


def lookup(store: Store, token: str) -> Principal | None:
    """The principal of a token that is known, not revoked and not expired; None otherwise. One indexed Core query
    per request, not cached: a revocation or an expiry takes effect on the very next request."""
    with store.engine.connect() as conn:
        row = conn.execute(_LOOKUP, {"token_hash": digest(token)}).first()
    if row is None or (row.expires_at is not None and as_utc(row.expires_at) <= utcnow()):
        return None
    return Principal(row.name, row.scope)
