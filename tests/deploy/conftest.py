"""Fixtures for the deployment tests: a fresh database per test on the real PostgreSQL server named by
UPSCALE_TEST_POSTGRES_URL (.ci/run starts one on loopback; unset on a developer machine, so these tests skip), and
an embedded Ray for this package (2 CPUs, as tests/orchestrator uses). That Ray is shut down when the package's tests
end, so tests/orchestrator's session Ray can start after it; if a Ray is already up (theirs ran first), it is reused
and left running."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from tests.orchestrator.conftest import TINY_SPEC  # noqa: F401  (re-exported for this package's tests)

POSTGRES_ENV = "UPSCALE_TEST_POSTGRES_URL"
# Seven segments (one of each kind: dense trunk and decay, upcycle, MoE trunk and decay, scratch trunk and decay),
# three observations: the smallest sweep that exercises every path through the scheduler.
MICRO_SPEC = """
name: micro
model: {sizes: [nano]}
moe: {experts: [4], topk: [1]}
upcycling: {methods: [naive], r: [0.5]}
tokens: {d1: [512], d2: [256], scratch: [512]}
train: {context: 16, batch_size: 4, lr: {dense: 3.0e-3, moe: 2.0e-3}, warmup_tokens: 64}
resources: {cpus: 1}
"""


def libpq(url: str) -> str:
    """The SQLAlchemy URL as psycopg's own connection string (no +driver)."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def with_database(url: str, name: str) -> str:
    return url.rsplit("/", 1)[0] + "/" + name


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A new, empty database on the test server, dropped afterwards (tests never see each other's rows)."""
    base = os.environ.get(POSTGRES_ENV)
    if not base:
        pytest.skip(f"{POSTGRES_ENV} is not set (no PostgreSQL server; .ci/run starts one)")
    import psycopg

    name = f"upscale_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(libpq(base), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_database(base, name)
    finally:
        with psycopg.connect(libpq(base), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="package")
def mlflow_sqlite(tmp_path_factory) -> str:
    """An MLflow SQLite store shared by this package's tests (creating its schema takes seconds)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
