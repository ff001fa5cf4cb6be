"""Alembic migrations of the state store; `orchestrator.store.migrate` runs them to head on every open."""
