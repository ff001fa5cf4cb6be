"""Migration 0009 adds the prediction ledger's table to a store with sweeps and segments in it, and going back down
removes it and leaves them."""

from __future__ import annotations

from alembic import command
from sqlalchemy import create_engine, inspect, text

from tests.orchestrator.conftest import TINY_SPEC
from upscale.control.records import PredictionRecord
from upscale.orchestrator.store import Store, alembic_config
from upscale.sweeps.loader import load_spec
from upscale.sweeps.planner import plan


def test_the_predictions_table_comes_and_goes_with_the_sweeps_left_alone(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    engine = create_engine(url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0008")
    assert "predictions" not in inspect(engine).get_table_names()
    engine.dispose()

    store = Store(url)  # migrates to head
    p = plan(load_spec(TINY_SPEC))
    sweep = store.create_sweep("tiny", {}, {"cpus": 1}, p.segments)
    decay = next(s for s in p.segments if s.observation is not None)
    with store.transaction() as s:
        s.add(PredictionRecord(sweep_id=sweep.id, segment_key=decay.id, analysis_id="a1", law="from-scratch",
                               predicted=3.0, sigma_fit=0.01, sigma_noise=0.02, lo80=2.9, hi80=3.1, lo95=2.8,
                               hi95=3.2))
    columns = {c["name"] for c in inspect(store.engine).get_columns("predictions")}
    assert {"sweep_id", "segment_key", "analysis_id", "predicted", "lo80", "hi95", "observed", "scored_at"} <= columns

    with store.engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0008")
    assert "predictions" not in inspect(store.engine).get_table_names()
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM sweeps")).scalar() == 1
        assert conn.execute(text("SELECT count(*) FROM segments")).scalar() == len(p.segments)
    with store.engine.begin() as conn:  # and up again: the revision is repeatable
        command.upgrade(alembic_config(conn), "head")
    assert "predictions" in inspect(store.engine).get_table_names()
    store.engine.dispose()
