"""Refit versions on a real SQLite store, fired by the refit loop as `upscale serve` runs it: a cron minute on
unchanged observations records nothing and runs no analysis, and each schedule's lag (`upscale_refit_age_seconds`)
is 0 while its latest version has every observation, however long nothing new arrives. Observations are written as
the scheduler writes them (tests/api/test_analysis.py `fill`)."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select, update

from tests.api.test_analysis import add_last_observation, fill
from upscale.api.metrics import render
from upscale.control.records import AnalysisRecord, RefitScheduleRecord
from upscale.control.refits import RefitLoop, create_schedule, lag_s, refits
from upscale.control.schemas import DEFAULT_ANALYSIS_BOOTSTRAP, RefitRequest, RefitScheduleCreate
from upscale.control.services import Services
from upscale.control.wiring import open_services
from upscale.orchestrator.settings import Settings


@pytest.fixture()
def services(tmp_path, mlflow_uri) -> Services:
    return open_services(Settings(home=tmp_path, mlflow_tracking_uri=mlflow_uri), auth=False)


def _next_minute(services: Services, schedule_id: str) -> None:
    """As if the loop's clock had moved on to the cron's next minute: the minute it claimed is forgotten."""
    with services.store.transaction() as s:
        s.execute(update(RefitScheduleRecord).where(RefitScheduleRecord.id == schedule_id)
                  .values(last_fired_minute=None))


def _analyses(services: Services) -> int:
    with services.store.transaction() as s:
        return s.scalar(select(func.count()).select_from(AnalysisRecord))


def test_a_cron_firing_on_unchanged_observations_records_nothing(services) -> None:
    sweep = fill(services, leave_out=1)
    body = RefitScheduleCreate(name="every minute", trigger="cron", cron="* * * * *",
                               request=RefitRequest(sweep_ids=[sweep], bootstrap=0))
    schedule = create_schedule(services, body, "alice")
    loop = RefitLoop(services)
    assert lag_s(services)[schedule.id] > 0  # observations no version has seen

    loop.tick()
    assert [r.version for r in refits(services, schedule.id)] == [1]
    assert lag_s(services) == {schedule.id: 0.0}
    analysed = _analyses(services)

    for _ in range(2):  # two more minutes, nothing new: no version, no analysis, and the lag stays 0
        _next_minute(services, schedule.id)
        loop.tick()
    assert [r.version for r in refits(services, schedule.id)] == [1] and _analyses(services) == analysed
    assert lag_s(services) == {schedule.id: 0.0}
    assert f'upscale_refit_age_seconds{{schedule="{schedule.id}"}} 0.0' in render(services).decode()

    add_last_observation(services, sweep)  # the next minute refits it (tests/api/test_refit_cli.py, slow)
    assert lag_s(services)[schedule.id] > 0
    loop.tick()  # still the minute it fired in: the lag waits for the next one
    assert len(refits(services, schedule.id)) == 1 and lag_s(services)[schedule.id] > 0


def test_a_schedule_takes_its_defaults_from_the_data(services) -> None:
    """No N1 given: the analysis runs at every size the sweep trained and D* is reported at the largest; the
    bootstrap is the analyses' (an interval on D*)."""
    sweep = fill(services)
    request = RefitRequest(sweep_ids=[sweep])
    assert (request.n1, request.bootstrap) == (None, DEFAULT_ANALYSIS_BOOTSTRAP)
    schedule = create_schedule(services, RefitScheduleCreate(name="defaults", trigger="on_new_observations",
                                                             request=request.model_copy(update={"bootstrap": 10})),
                               "alice")
    RefitLoop(services).tick()
    (version,) = refits(services, schedule.id)
    with services.store.transaction() as s:
        analysis = s.get(AnalysisRecord, version.analysis_id)
    trained = sorted({o.N1 for o in services.store.observations(sweep) if o.N1})
    assert analysis.params["n1s"] is None  # the analysis's own default: the sweep's sizes
    assert [r["n1"] for r in analysis.record["upcycled"][0]["dstar"]["results"]] == trained
    assert version.dstar_answer["n1"] == trained[-1] and version.dstar_answer["intervals"]["95"] is not None
