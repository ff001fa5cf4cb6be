"""The state store on a real SQLite file (and on PostgreSQL when UPSCALE_TEST_POSTGRES_URL names a server):
migrations reach exactly the models' schema (and go back down), and every transition (claim, fail with retries,
release, complete) leaves the rows a scheduler relies on.

Strategy: plan the tiny sweep with the real planner, record it, and drive segments through their states by hand,
asserting counts and statuses after each step. No Ray here. On PostgreSQL each test starts from an empty schema."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Table, event, inspect

from tests.orchestrator.conftest import TINY_SPEC
from upscale.orchestrator.errors import OrchestratorError
from upscale.orchestrator.records import Base
from upscale.orchestrator.store import Store, alembic_config
from upscale.sweeps.loader import load_spec
from upscale.sweeps.planner import plan
from upscale.sweeps.segments import SegmentResult

SQLITE_DEFAULT_VARIABLES = 32766  # SQLITE_MAX_VARIABLE_NUMBER of SQLite's default build since 3.32


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request, tmp_path) -> Iterator[Store]:
    if request.param == "sqlite":
        yield Store(f"sqlite:///{tmp_path / 'state.db'}")
        return
    url = os.environ.get("UPSCALE_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("UPSCALE_TEST_POSTGRES_URL is not set")
    store = Store(url)
    with store.engine.begin() as conn:  # start empty: drop what an earlier test left, then migrate up again
        command.downgrade(alembic_config(conn), "base")
    yield Store(url)
    store.engine.dispose()


@pytest.fixture
def tiny():
    return plan(load_spec(TINY_SPEC))


def _result(seg, loss: float | None = 3.0, branches: dict[int, str] | None = None) -> SegmentResult:
    return SegmentResult(segment_id=seg.id, kind=seg.spec.kind, val_loss=loss, tokens=seg.tokens, wall_s=1.0,
                         tokens_per_s=float(seg.tokens), checkpoint=f"/ck/{seg.id}/final",
                         branch_checkpoints=branches or {})


def test_migrations_reach_the_models_schema_and_go_back(store: Store) -> None:
    with store.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"version_table": "upscale_alembic_version"})
        diffs = compare_metadata(context, Base.metadata)
        # the models are what the migrations build (other packages' tables count once their models are imported)
        assert [d for d in diffs if _table(d) in Base.metadata.tables] == []
        head = ScriptDirectory.from_config(alembic_config(conn)).get_current_head()
        assert context.get_current_revision() == head
    with store.engine.begin() as conn:
        command.downgrade(alembic_config(conn), "base")
    assert set(inspect(store.engine).get_table_names()) == {"upscale_alembic_version"}
    Store(store.url)  # reopening migrates back up
    assert {"sweeps", "segments", "sweep_segments", "attempts", "observations", "checkpoints"} <= set(
        inspect(store.engine).get_table_names())


def _table(diff: tuple | list) -> str:
    """The table an Alembic autogenerate diff concerns."""
    if isinstance(diff, list):  # modify_* ops come grouped: [(op, schema, table, column, ...), ...]
        return diff[0][2]
    if isinstance(diff[1], Table):  # add_table / remove_table
        return diff[1].name
    if hasattr(diff[1], "table"):  # indexes and constraints
        return diff[1].table.name
    return diff[2]  # add_column / remove_column: (op, schema, table, column)


def test_a_second_sweep_shares_segments_it_has_in_common(store: Store, tiny) -> None:
    a = store.create_sweep("a", {}, {"cpus": 1}, tiny.segments)
    b = store.create_sweep("b", {}, {"cpus": 1}, tiny.segments[:5])
    assert len(store.members(a.id)) == 26 and len(store.members(b.id)) == 5
    assert len(store.segments([s.id for s in tiny.segments])) == 26
    assert [seg.key for seg, _ in store.members(a.id)] == [s.id for s in tiny.segments]  # topological order kept
    with pytest.raises(OrchestratorError, match="no sweep 'nope'"):
        store.sweep("nope")


def test_sweeps_lists_all_or_only_one_status_oldest_first(store: Store, tiny) -> None:
    a = store.create_sweep("a", {}, {"cpus": 1}, tiny.segments[:2])
    b = store.create_sweep("b", {}, {"cpus": 1}, tiny.segments[:2])
    c = store.create_sweep("c", {}, {"cpus": 1}, tiny.segments[:2])
    store.set_sweep(b.id, status="running")
    assert [s.id for s in store.sweeps()] == [a.id, b.id, c.id]
    assert [s.id for s in store.sweeps(status="pending")] == [a.id, c.id]
    assert [s.id for s in store.sweeps(status="done")] == []


def test_poll_reads_status_and_members_together(store: Store, tiny) -> None:
    a = store.create_sweep("a", {}, {"cpus": 1}, tiny.segments)
    store.request_cancel(a.id)
    status, members = store.poll(a.id)
    assert status == "cancelled" and [(seg.key, link.axes) for seg, link in members] == [
        (seg.key, link.axes) for seg, link in store.members(a.id)]
    with pytest.raises(OrchestratorError, match="no sweep 'nope'"):
        store.poll("nope")


def test_claim_is_exclusive_and_failures_retry_up_to_the_maximum(store: Store, tiny) -> None:
    store.create_sweep("a", {}, {"cpus": 1}, tiny.segments)
    key = tiny.segments[0].id
    first = store.claim(key, "h:1:a")
    assert first is not None and first.number == 1
    assert store.claim(key, "h:2:b") is None  # someone else holds it
    assert store.fail(key, first, "boom", max_attempts=2) == "pending"
    second = store.claim(key, "h:2:b")
    assert second is not None and second.number == 2
    assert store.fail(key, second, "boom again", max_attempts=2) == "failed"
    assert store.segment(key).status == "failed" and store.segment(key).attempts == 2
    assert [a.status for a in store.attempts(key)] == ["failed", "failed"]
    store.reset_failed([key])
    third = store.claim(key, "h:3:c")
    assert third is not None and third.number == 3
    store.release(key, third, "orphaned")  # a dead scheduler's attempt does not count as a failure
    assert store.segment(key).status == "pending"
    assert [a.status for a in store.attempts(key)] == ["failed-reset", "failed-reset", "orphaned"]


def test_complete_records_result_checkpoints_and_observation_once(store: Store, tiny) -> None:
    sweep = store.create_sweep("a", {}, {"cpus": 1}, tiny.segments)
    trunk = tiny.segments[0]  # the dense trunk's first piece, and the decay branching from its end
    decay = next(s for s in tiny.segments if s.spec.kind == "dense_decay" and s.spec.parent_ids == (trunk.id,))
    attempt = store.claim(trunk.id, "h:1:a")
    assert store.complete(trunk.id, attempt, _result(trunk, branches={448: "/ck/t/448", 896: "/ck/t/896"}))
    assert not store.complete(trunk.id, attempt, _result(trunk))  # not running any more: nothing written
    attempt = store.claim(decay.id, "h:1:a")
    assert store.complete(decay.id, attempt, _result(decay, loss=3.25))
    obs = store.observations(sweep.id)
    assert len(obs) == 1
    o = obs[0]
    assert (o.kind, o.N1, o.D1, o.D, o.loss, o.trunk) == ("dense", decay.observation.N1, 512, 512, 3.25, trunk.id)
    seg = store.segment(trunk.id)
    assert seg.status == "done" and seg.result["branch_checkpoints"] == {"448": "/ck/t/448", "896": "/ck/t/896"}
    assert [a.status for a in store.attempts(trunk.id)] == ["done"]


def test_a_query_of_more_keys_than_sqlite_binds_reads_them_all(store: Store, tiny) -> None:
    """Every IN list is sent in slices (`store.chunks`): 40,000 keys, beyond the 32,766 variables per statement of
    SQLite's default build (this one's Python may allow more: set to the default here), read what the real keys
    alone read ("too many SQL variables" before)."""
    if store.engine.dialect.name == "sqlite":
        event.listen(store.engine, "connect",
                     lambda conn, _: conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, SQLITE_DEFAULT_VARIABLES))
        store.engine.dispose()  # the pooled connections reopen with the limit
    store.create_sweep("a", {}, {"cpus": 1}, tiny.segments)
    real = [s.id for s in tiny.segments]
    absent = [f"{i:016x}" for i in range(40_000)]
    assert set(store.segments([*absent, *real])) == set(real)
    done, stale = store.holdings({k: k for k in [*absent, *real]})
    assert done == set() and stale == {}
    assert store.other_cut_holdings({real[0]: absent}, {}) == {}
    store.reset_failed([*absent, *real])
    assert {seg.status for seg in store.segments(real).values()} == {"pending"}
