"""One module per schema revision (create new ones with `alembic -c orchestrator/migrations/alembic.ini revision`)."""
