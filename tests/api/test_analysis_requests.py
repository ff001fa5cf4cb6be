"""Requested analyses never wedge the server, and nobody's refit replaces a sweep's own analysis.

* Forty identical POST /sweeps/{id}/analysis from one token while the first runs: each answers 409 at once naming
  the running analysis (no request waits for another's work), /healthz, GET /sweeps and /metrics answer meanwhile,
  a third analysis of the same name is a 429 with nothing written, and stopping the server ends the running ones
  `failed`, "interrupted" (a real uvicorn server in this process, real SQLite).
* SIGTERM to a real `upscale serve` subprocess during a requested analysis of a sweep that has more observations
  than its last analysis saw: the server stops, the row is not left `running`, and the next start's analysis loop
  runs that analysis again, with the parameters it was requested with, on the whole sweep; decisions then answer
  from it.
* bob's refit (a write token) of alice's sweep on observations her analysis has not seen yet: her decision keeps
  answering from her analysis, her sweep's MLflow run keeps showing it, and her loop still analyses the new
  observations itself.

The stores are filled the way the scheduler fills them (tests/api/test_analysis.py `fill`), nothing is trained.
"""

from __future__ import annotations

import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from sqlalchemy import select

from tests.api.conftest import serve
from tests.api.test_analysis import GRID, add_last_observation, fill, wait_logged
from tests.api.test_recovery import upscale_serve, wait_for
from upscale.client import Client
from upscale.control import analyses
from upscale.control.analyses import AnalysisLoop, run_analysis
from upscale.control.analysis_jobs import PER_OWNER
from upscale.control.records import AnalysisRecord
from upscale.control.services import Services
from upscale.control.sweeps import owner_of
from upscale.control.tokens import create_token
from upscale.control.wiring import open_services
from upscale.orchestrator.settings import Settings
from upscale.orchestrator.tracking import RunTree

SLOW = {"bootstrap": 500}  # ~30 s of fitting on this grid: still running while the test asks again


def _rows(services: Services) -> list[AnalysisRecord]:
    with services.store.transaction() as s:
        return list(s.scalars(select(AnalysisRecord).order_by(AnalysisRecord.created_at)))


@pytest.mark.slow  # ~7 s on CI's 2 cores (make test stays under 10 minutes)
def test_identical_requests_get_409_at_once_and_the_server_stays_responsive(tmp_path, mlflow_uri) -> None:
    # the per-minute request quota (tests/api/test_quotas.py) would answer some of the forty 429 first
    settings = Settings(home=tmp_path, mlflow_tracking_uri=mlflow_uri, max_analyses_per_minute=100)
    services = open_services(settings)
    sid = fill(services)
    with serve(settings, scheduler=False) as live:
        c = live.client()
        first = c.post(f"/sweeps/{sid}/analysis", json=SLOW)
        assert first.status_code == 202 and first.json()["status"] == "running", first.text
        running = first.json()["id"]

        def post(_: int) -> httpx.Response:
            with live.client() as own:
                return own.post(f"/sweeps/{sid}/analysis", json=SLOW)

        with ThreadPoolExecutor(40) as pool:
            answers = pool.map(post, range(40))
            with live.client() as other:  # while the forty are in flight
                for path in ("/healthz", "/sweeps", "/metrics"):
                    assert other.get(path).status_code == 200, path
            answers = list(answers)
        assert {r.status_code for r in answers} == {409}, {r.status_code for r in answers}
        assert all(f"analysis {running} of these inputs is running" in r.json()["detail"]
                   and r.headers["location"] == f"/analyses/{running}" for r in answers)
        assert c.get(f"/analyses/{running}").json()["status"] == "running"

        # Other parameters are another analysis: the caller's second, then none past the bound.
        second = c.post(f"/sweeps/{sid}/analysis", json={**SLOW, "seed": 1})
        assert second.status_code == 202 and PER_OWNER == 2
        too_many = c.post(f"/sweeps/{sid}/analysis", json={**SLOW, "seed": 2})
        assert too_many.status_code == 429 and "alice has 2 requested analyses running" in too_many.text
        assert len(_rows(services)) == 2  # the refused one wrote nothing
    # The server stopped: its analyses were interrupted, not left running, and say so.
    stopped = _settled(services)
    assert [r.status for r in stopped] == ["failed", "failed"], [(r.status, r.error) for r in stopped]
    assert all(r.error.startswith("interrupted") for r in stopped)


def _settled(services: Services, timeout_s: float = 60) -> list[AnalysisRecord]:
    """The rows once none is running (an interrupted analysis stops at its next progress step)."""
    deadline = time.monotonic() + timeout_s
    while any(r.status == "running" for r in _rows(services)):
        assert time.monotonic() < deadline, "an analysis is still running"
        time.sleep(0.2)
    return _rows(services)


@pytest.mark.slow  # a real server stopped mid-analysis, restarted with Ray, then a full analysis: ~100 s on 2 cores
def test_sigterm_during_an_analysis_then_restart_runs_it_again_as_requested(tmp_path, mlflow_uri) -> None:
    settings = Settings(home=tmp_path, mlflow_tracking_uri=mlflow_uri)
    services = open_services(settings)
    sid = fill(services, leave_out=1)
    older = run_analysis(services, [sid], bootstrap=0, owner="alice", trigger="completed")  # at all but one point
    add_last_observation(services, sid)  # the sweep has more now
    token = {"Authorization": f"Bearer {create_token(services.store, 'write', 'alice')}"}
    log = tmp_path / "serve.log"

    with upscale_serve(settings, log, "--no-scheduler") as (url, proc):  # it runs only what is asked
        r = httpx.post(f"{url}/sweeps/{sid}/analysis", json=SLOW, headers=token, timeout=30)
        assert r.status_code == 202, r.text
        interrupted = r.json()["id"]
        proc.send_signal(signal.SIGTERM)  # the server process only, as an orchestrator stops it
        try:
            proc.wait(120)  # SIGTERM still stops it
        except subprocess.TimeoutExpired:
            raise AssertionError(f"SIGTERM did not stop the server:\n{log.read_text()[-3000:]}") from None
    row = next(r for r in _rows(services) if r.id == interrupted)
    assert row.status == "failed" and row.error.startswith("interrupted"), (row.status, row.error)

    with upscale_serve(settings, log) as (url, proc):
        def answered() -> dict | None:
            d = httpx.get(f"{url}/decisions/upcycle", params={"n1": 2e4, "d1": 1024, "d2": 1024, "sweep_id": sid},
                          headers=token, timeout=30).json()
            return d if d["analysis"]["id"] != older.id else None

        d = wait_for(answered, 300, "the interrupted analysis to run again", proc, log)
    again = next(r for r in _rows(services) if r.id == d["analysis"]["id"])
    assert again.id == interrupted and again.status == "done" and again.trigger == "request"
    assert again.params["bootstrap"] == SLOW["bootstrap"] and again.sweep_ids == [sid]  # as requested
    assert sum(again.record["points"].values()) == sum(older.record["points"].values()) + 1  # the whole sweep


@pytest.mark.slow  # three analyses with bootstrap on a real server: ~55 s on 2 cores
def test_bobs_refit_of_alices_sweep_leaves_her_decision_alone(tmp_path, mlflow_uri) -> None:
    settings = Settings(home=tmp_path, mlflow_tracking_uri=mlflow_uri)
    services = open_services(settings)
    sid = fill(services, leave_out=1)
    tree = RunTree.for_settings(settings)
    services.store.set_sweep(sid, mlflow_run_id=(parent := tree.start_sweep(sid, GRID["name"], GRID)))
    question = {"n1": 2e4, "d1": 1024, "d2": 1024, "sweep_id": sid}
    with serve(settings, scheduler=False) as live:
        alice = live.client()
        bob = live.client({"Authorization": f"Bearer {create_token(services.store, 'write', 'bob')}"})
        assert owner_of(services, sid) == "alice"
        token = live.write["Authorization"].split()[1]
        mine = Client(live.url, token).analyze(sid, bootstrap=0, poll_s=0.2)  # posts, then polls until done
        assert mine["status"] == "done" and mine["owner"] == "alice"
        before = alice.get("/decisions/upcycle", params=question).json()
        assert before["analysis"]["id"] == mine["id"]

        add_last_observation(services, sid)  # new observations: bob's refit sees them first
        schedule = bob.post("/refit-schedules", json={"name": "bobs", "trigger": "on_new_observations",
                                                      "request": {"sweep_ids": [sid], "bootstrap": 0}})
        assert schedule.status_code == 201, schedule.text
        refit = bob.post(f"/refit-schedules/{schedule.json()['id']}/run")
        assert refit.status_code == 201, refit.text
        bobs = bob.get(f"/analyses/{refit.json()['analysis_id']}").json()
        assert bobs["owner"] == "bob" and bobs["trigger"] == "refit" and bobs["status"] == "done"

        after = alice.get("/decisions/upcycle", params=question).json()
        assert after["analysis"]["id"] == mine["id"] and after["verdict"] == before["verdict"]
        assert alice.get(f"/sweeps/{sid}/analysis").json()["id"] == mine["id"]
        wait_logged(tree, parent, mine["id"])  # her run's, too

        # Her loop still analyses the observations bob's refit saw: the new analysis is hers.
        AnalysisLoop(services, bootstrap=0).tick()
        hers = alice.get("/decisions/upcycle", params=question).json()["analysis"]["id"]
        assert hers not in (mine["id"], bobs["id"])
        assert analyses.latest_analysis(services.store, sid).owner == "alice"
