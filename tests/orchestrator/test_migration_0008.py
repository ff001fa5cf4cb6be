"""Migration 0008 adds a segment's training-semantics version: stored segments become version 1 (their unversioned
key is their key, their config says `semantics: 1` so it still hashes to the key once the code's version is higher),
and going back down removes the columns and what it wrote into configs."""

from __future__ import annotations

from alembic import command
from sqlalchemy import create_engine, insert, inspect, select, text

from tests.orchestrator.conftest import TINY_SPEC
from upscale.orchestrator.records import SegmentRecord
from upscale.orchestrator.store import Store, alembic_config
from upscale.sweeps import segments
from upscale.sweeps.loader import load_spec
from upscale.sweeps.planner import plan
from upscale.sweeps.segments import SegmentSpec


def test_stored_segments_become_version_1_and_the_migration_goes_back_down(tmp_path, monkeypatch) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    engine = create_engine(url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0007")
    specs = {s.id: s.spec for s in plan(load_spec(TINY_SPEC)).segments}
    with engine.begin() as conn:  # configs as code before 0008 wrote them: no `semantics`
        for key, spec in specs.items():
            config = {k: v for k, v in spec.model_dump(mode="json").items() if k != "semantics"}
            conn.execute(insert(SegmentRecord.__table__).values(
                key=key, kind=spec.kind, config=config, parents=list(spec.parent_ids), status="done", attempts=1,
                tokens=0, flops=0.0))

    store = Store(url)  # migrates to head
    with store.transaction() as s:
        rows = s.scalars(select(SegmentRecord)).all()
        assert {r.key for r in rows} == set(specs)
        assert all(r.semantics == 1 and r.unversioned_key == r.key and r.config["semantics"] == 1 for r in rows)
    monkeypatch.setattr(segments, "TRAINING_SEMANTICS", 2)  # a stored config still reads (and hashes) as version 1
    assert all(SegmentSpec.model_validate(r.config).id == r.key for r in rows)
    assert all(SegmentSpec.model_validate({k: v for k, v in r.config.items() if k != "semantics"}).id != r.key
               for r in rows)  # without it, a config is the running code's version

    with store.engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0007")
    columns = {c["name"] for c in inspect(store.engine).get_columns("segments")}
    assert not columns & {"semantics", "unversioned_key", "reused_from"}
    assert not {c["name"] for c in inspect(store.engine).get_columns("sweeps")} & {"stale_segments", "reuse_stale"}
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM segments")).scalar() == len(specs)
        for config in conn.execute(select(SegmentRecord.__table__.c.config)).scalars():
            assert "semantics" not in config
    store.engine.dispose()
