"""The state store, its migrations and the scheduler on a real PostgreSQL server (the deployment's database), as
they run on SQLite everywhere else.

Strategy: each test gets its own empty database on the server .ci/run starts (UPSCALE_TEST_POSTGRES_URL; the tests
skip with that reason where it is unset). Migrations go up to the models' schema with PostgreSQL's own types and
back down to nothing; claims race from many threads at once, which on PostgreSQL means real row locks between
connections; and the scheduler runs the tiny sweep with the counting segment function (tests/orchestrator), alone
and as two schedulers sharing one sweep, each segment trained exactly once."""

from __future__ import annotations

import json
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

import upscale.control.records  # noqa: F401  (registers the API's tables on the one Base: the comparison covers the whole schema)
from tests.deploy.conftest import TINY_SPEC
from tests.orchestrator.segment_fns import counting_segment, loss_of
from upscale.orchestrator.records import Base
from upscale.orchestrator.scheduler import Scheduler
from upscale.orchestrator.service import Orchestrator
from upscale.orchestrator.settings import Settings
from upscale.orchestrator.store import Store, alembic_config
from upscale.sweeps.loader import load_spec
from upscale.sweeps.planner import plan
from upscale.sweeps.segments import SegmentResult

pytestmark = pytest.mark.postgres
TABLES = {"sweeps", "segments", "sweep_segments", "attempts", "observations", "checkpoints", "api_tokens"}


def test_migrations_build_the_models_schema_with_postgres_types_and_go_back_down(postgres_url: str) -> None:
    store = Store(postgres_url)
    assert store.engine.dialect.name == "postgresql"
    with store.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"version_table": "upscale_alembic_version"})
        assert compare_metadata(context, Base.metadata) == []
        assert context.get_current_revision() == ScriptDirectory.from_config(alembic_config(conn)).get_current_head()
    insp = inspect(store.engine)
    assert set(insp.get_table_names()) >= TABLES
    columns = {c["name"]: c["type"] for c in insp.get_columns("segments")}
    assert str(columns["config"]) == "JSON" and str(columns["tokens"]) == "BIGINT"
    assert str(columns["heartbeat_at"]) == "TIMESTAMP" and columns["heartbeat_at"].timezone  # timestamptz
    with store.engine.begin() as conn:
        command.downgrade(alembic_config(conn), "base")
    assert set(inspect(store.engine).get_table_names()) == {"upscale_alembic_version"}
    store.engine.dispose()
    again = Store(postgres_url)  # opening migrates up again, on a database that has been down
    assert set(inspect(again.engine).get_table_names()) >= TABLES
    again.engine.dispose()


def test_claims_race_across_connections_and_exactly_one_wins(postgres_url: str) -> None:
    store = Store(postgres_url)
    tiny = plan(load_spec(TINY_SPEC))
    store.create_sweep("a", {}, {"cpus": 1}, tiny.segments)
    keys = [s.id for s in tiny.segments[:5]]
    barrier = threading.Barrier(8)

    def claim(i: int) -> list[str]:
        barrier.wait()
        return [k for k in keys if store.claim(k, f"host:{i}:x") is not None]

    with ThreadPoolExecutor(8) as pool:
        won = [k for ks in pool.map(claim, range(8)) for k in ks]
    assert sorted(won) == sorted(keys)  # every segment claimed once, by one of the eight
    seg = store.segment(keys[0])
    assert seg.status == "running" and seg.attempts == 1 and seg.heartbeat_at.tzinfo is not None
    attempt = store.open_attempt(keys[0])
    result = SegmentResult(segment_id=keys[0], kind=seg.kind, val_loss=None, tokens=seg.tokens, wall_s=1.0,
                           tokens_per_s=1.0, checkpoint="/ck/final", branch_checkpoints={64: "/ck/64"})
    assert store.complete(keys[0], attempt, result)
    assert not store.complete(keys[0], attempt, result)  # a second completion of the same attempt is refused
    assert store.segment(keys[0]).result["branch_checkpoints"] == {"64": "/ck/64"}  # JSON round trip
    store.engine.dispose()


@pytest.mark.slow  # ~9 s on CI's 2 cores (make test stays under 10 minutes)
def test_the_scheduler_runs_a_sweep_on_postgres_and_two_schedulers_share_it(postgres_url: str, tmp_path: Path,
                                                                            mlflow_sqlite: str, ray_session) -> None:
    # postgres_url first: without a server the test skips before Ray and the MLflow store are started
    settings = Settings(home=tmp_path, db_url=postgres_url, mlflow_tracking_uri=mlflow_sqlite)
    orch = Orchestrator.open(settings)
    spec = load_spec(TINY_SPEC)
    root = Path(settings.checkpoint_dir)
    root.mkdir(parents=True)
    (root / "knobs.json").write_text(json.dumps({"step_s": 0.005}))
    sweep = orch.submit(spec)
    outs = []

    def run() -> None:
        outs.append(Scheduler(orch.store, settings, segment_fn=counting_segment, poll_s=0.05).run(sweep.id))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    p = plan(spec)
    assert [o.status for o in outs] == ["done", "done"]
    assert sorted(outs[0].trained + outs[1].trained) == sorted(s.id for s in p.segments)
    events = [json.loads(line) for line in (root / "events.jsonl").read_text().splitlines()]
    assert Counter(e["segment"] for e in events if e["event"] == "end") == Counter({s.id: 1 for s in p.segments})
    obs = orch.store.observations(sweep.id)
    by_key = {s.id: s for s in p.segments}
    assert Counter(o.kind for o in obs) == {"dense": 2, "upcycled": 8, "scratch": 1}
    assert all(o.loss == pytest.approx(loss_of(by_key[o.segment_key].spec), abs=1e-12) for o in obs)
    assert orch.store.sweep(sweep.id).status == "done"
    orch.store.engine.dispose()
