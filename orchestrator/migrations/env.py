"""Alembic environment: migrate the connection `orchestrator.store.migrate` hands over, or UPSCALE_DB_URL's."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from upscale.orchestrator.records import Base
from upscale.orchestrator.settings import get_settings

# Our own version table: Optuna's LR-search studies live in the same database and keep theirs in `alembic_version`.
VERSION_TABLE = "upscale_alembic_version"


def _run(connection) -> None:
    # render_as_batch: SQLite cannot ALTER most things in place; batch mode copies the table instead.
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True,
                      version_table=VERSION_TABLE)
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    with create_engine(get_settings().db_url).connect() as conn:
        _run(conn)
