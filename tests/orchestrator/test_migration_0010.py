"""Migration 0010 on a store holding refits: a version that named no analysis (it only listed fit ids) is deleted, one
that ran an analysis is kept, `fits` goes and `analysis_id` becomes required; going back down restores the column
empty and the revision can be applied again."""

from __future__ import annotations

from alembic import command
from sqlalchemy import create_engine, inspect, text

from upscale.orchestrator.store import Store, alembic_config

INSERT_SCHEDULE = ("INSERT INTO refit_schedules (id, name, \"trigger\", request, owner, active, created_at) "
                   "VALUES ('s1', 'x', 'on_new_observations', '{}', 'alice', 1, '2026-01-01')")
INSERT_REFIT = ("INSERT INTO refits (schedule_id, version, inputs_hash, fits, diff, left_interval, analysis_id, "
                "created_at) VALUES ('s1', :v, 'h', :fits, '{}', 0, :a, '2026-01-01')")


def test_refits_without_an_analysis_go_and_the_rest_name_theirs(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    engine = create_engine(url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0009")
        conn.execute(text(INSERT_SCHEDULE))
        conn.execute(text(INSERT_REFIT), {"v": 1, "fits": '{"scratch": "f1"}', "a": None})
        conn.execute(text(INSERT_REFIT), {"v": 2, "fits": "{}", "a": "a2"})
    engine.dispose()

    store = Store(url)  # migrates to head
    columns = {c["name"]: c for c in inspect(store.engine).get_columns("refits")}
    assert "fits" not in columns and not columns["analysis_id"]["nullable"]
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT version, analysis_id FROM refits")).all() == [(2, "a2")]

    with store.engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0009")
    columns = {c["name"]: c for c in inspect(store.engine).get_columns("refits")}
    assert "fits" in columns and columns["analysis_id"]["nullable"]
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT version, fits FROM refits")).all() == [(2, "{}")]
    with store.engine.begin() as conn:  # and up again: the revision is repeatable
        command.upgrade(alembic_config(conn), "head")
    assert "fits" not in {c["name"] for c in inspect(store.engine).get_columns("refits")}
    store.engine.dispose()
