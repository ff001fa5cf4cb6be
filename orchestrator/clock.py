"""Timestamps as the store keeps them: timezone-aware UTC. Apart from the records (orchestrator/records.py) so that
what only reads or validates a time (control/schemas.py, and through it the CLI's `plan`) needs no SQLAlchemy."""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(when: datetime) -> datetime:
    """``when`` as a timezone-aware UTC time: SQLite gives timestamps back naive, and they were written in UTC."""
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
