"""The control layer's tables come from migrations 0002-0005 exactly as control/records.py declares them, and a cron
schedule fires on the minutes it names."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from upscale.control.cron import check_cron, fires_at
from upscale.control.records import RefitRecord, TokenRecord
from upscale.orchestrator.records import Base
from upscale.orchestrator.store import Store, alembic_config

API_TABLES = {"api_tokens", "sweep_owners", "fits", "analyses", "refit_schedules", "refits"}


def test_migration_builds_the_api_tables(tmp_path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'u.db'}")
    assert {TokenRecord.__tablename__, RefitRecord.__tablename__} <= API_TABLES <= set(Base.metadata.tables)
    with store.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"version_table": "upscale_alembic_version"})
        diffs = [d for d in compare_metadata(context, Base.metadata) if any(t in repr(d) for t in API_TABLES)]
        assert diffs == []
        head = ScriptDirectory.from_config(alembic_config(conn)).get_current_head()
        assert context.get_current_revision() == head


@pytest.mark.parametrize(("expr", "when", "hit"), [
    ("*/15 * * * *", datetime(2026, 11, 23, 12, 45, tzinfo=UTC), True),
    ("*/15 * * * *", datetime(2026, 11, 23, 12, 46, tzinfo=UTC), False),
    ("*/15 * * * *", datetime(2026, 11, 23, 12, 44, tzinfo=UTC), False),  # the minute before a firing one
    ("0 3 * * 1-5", datetime(2026, 11, 23, 3, 0, tzinfo=UTC), True),  # a Monday
    ("0 3 * * 0,6", datetime(2026, 11, 23, 3, 0, tzinfo=UTC), False),
])
def test_a_schedule_fires_on_the_minutes_it_names(expr: str, when: datetime, hit: bool) -> None:
    assert fires_at(expr, when) is hit


@pytest.mark.parametrize(("expr", "words"), [("* * *", "needs 5 fields"), ("* * * * * 0", "needs 5 fields"),
                                             ("61 * * * *", "Bad minute"), ("* * * 13 *", "Bad month")])
def test_a_bad_cron_says_what_is_wrong(expr: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        check_cron(expr)


def test_racing_refit_loops_claim_a_cron_minute_once(tmp_path, mlflow_uri) -> None:
    """Eight loops (threads, each its own connection) claim the same minute of one schedule: exactly one fires;
    the next minute can be claimed again, an earlier one never."""
    from concurrent.futures import ThreadPoolExecutor

    from upscale.control.records import RefitScheduleRecord
    from upscale.control.refits import claim_minute
    from upscale.control.wiring import open_services
    from upscale.orchestrator.settings import Settings

    services = open_services(Settings(home=tmp_path, mlflow_tracking_uri=mlflow_uri))
    with services.store.transaction() as s:
        s.add(RefitScheduleRecord(id="s1", name="each minute", trigger="cron", cron="* * * * *", request={},
                                  owner="t", active=True))
    minute = datetime(2026, 11, 23, 12, 45, tzinfo=UTC)
    with ThreadPoolExecutor(8) as pool:
        wins = list(pool.map(lambda _: claim_minute(services, "s1", minute), range(8)))
    assert wins.count(True) == 1
    assert claim_minute(services, "s1", minute.replace(minute=46))
    assert not claim_minute(services, "s1", minute)


def test_a_refit_tick_reads_each_sweeps_observations_once(tmp_path, mlflow_uri, monkeypatch) -> None:
    """Two schedules over the same two sweeps: one tick loads each sweep's observations and reads its trunk curves
    (its segments) once (the analyses then cannot run, as there are none yet, and each schedule records its own
    error)."""
    from collections import Counter

    from tests.api.test_auth_validation import SPEC
    from upscale.control import sweeps
    from upscale.control.refits import RefitLoop, create_schedule, schedules
    from upscale.control.schemas import RefitScheduleCreate
    from upscale.control.wiring import open_services
    from upscale.orchestrator.settings import Settings
    from upscale.sweeps.spec import parse_spec

    services = open_services(Settings(home=tmp_path, mlflow_tracking_uri=mlflow_uri))
    ids = [sweeps.submit(services, parse_spec({**SPEC, "name": n}), "t").id for n in ("a", "b")]
    request = {"sweep_ids": ids}
    for name in ("one", "two"):
        create_schedule(services, RefitScheduleCreate(name=name, trigger="on_new_observations", request=request), "t")
    reads, observations = Counter(), services.store.observations
    monkeypatch.setattr(services.store, "observations", lambda s: reads.update([s]) or observations(s))
    segment_reads, members = Counter(), services.store.members
    monkeypatch.setattr(services.store, "members", lambda s: segment_reads.update([s]) or members(s))
    RefitLoop(services).tick()
    assert reads == Counter(ids) and segment_reads == Counter(ids)
    assert [s.last_error for s in schedules(services)] == [f"sweep {', '.join(sorted(ids))} has no finished "
                                                           "segments yet: the analysis needs the losses of finished "
                                                           "decay segments; it runs by itself when they finish"] * 2
    RefitLoop(services).tick()  # a new tick reads afresh (the inputs are unchanged: nothing fires)
    assert reads == Counter(ids * 2) and segment_reads == Counter(ids * 2)
