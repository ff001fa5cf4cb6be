"""The service's analyses on a real SQLite store: one analysis per (sweeps, inputs) however many triggers race, the
routes (202 then polled, 200/404/409, plots by listed name only), decisions from the newest analysis, refits
running it, the loop that runs it by itself (and again when interrupted), and `upscale analyze` through the
console script.

The store is filled the way the scheduler fills it (a submitted sweep, its decay segments done with an observation
each), with losses drawn from the paper's Table 2 laws at the planned coordinates (fitting/synthetic.py), so every
law can be fitted without training anything.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sqlalchemy import select, update

from tests.api.conftest import serve
from upscale.control import analyses
from upscale.control.analyses import AnalysisLoop, NotReady, run_analysis
from upscale.control.records import AnalysisRecord
from upscale.control.services import Services
from upscale.control.sweeps import submit
from upscale.control.wiring import open_services
from upscale.fitting.laws import get_law
from upscale.fitting.synthetic import TABLE2
from upscale.orchestrator.records import ObservationRecord, SegmentRecord
from upscale.orchestrator.settings import Settings
from upscale.orchestrator.tracking import RunTree
from upscale.sweeps.spec import parse_spec

UPSCALE = Path(sys.executable).parent / "upscale"
GRID = {
    "name": "analysis-test",
    "model": {"sizes": [{"n_layer": 1, "d_model": 16, "n_head": 2}, {"n_layer": 1, "d_model": 24, "n_head": 2},
                        {"n_layer": 1, "d_model": 32, "n_head": 2}]},
    "moe": {"experts": [4], "topk": [2]},
    "upcycling": {"methods": ["naive"]},
    "tokens": {"d1": [1024, 2048], "d2": [512, 1024, 2048], "scratch": [1024, 2048, 4096]},
    "train": {"context": 16, "batch_size": 8, "lr": {"dense": 3.0e-3, "moe": 2.0e-3}, "warmup_tokens": 256},
    "data": {"corpus": "builtin:python-stdlib", "tokenizer": "bytes", "eval_tokens": 2048},
    "resources": {"cpus": 1},
}

OTHER_GRID = {**GRID, "name": "other", "train": {**GRID["train"], "context": 32}}  # no segment shared with GRID's


def _loss(o: dict, rng: np.random.Generator) -> float:
    """The paper's law for the observation's kind at its planned coordinates, with 0.2% noise, halved: at these tiny
    sizes the law's losses would lie above ln 256, the loss of an untrained byte-level model, and every answer would
    be refused as outside the law's sane region."""
    if o["kind"] == "upcycled":
        law, params, row = get_law("joint"), TABLE2["upcycled"], {"N1": o["N1"], "D1": o["D1"], "D2": o["D2"]}
    else:
        law, params, row = get_law("chinchilla"), TABLE2["dense" if o["kind"] == "dense" else "moe"], \
            {"N": o["N1"], "D": o["D"]}
    return float(law.predict(params, pd.DataFrame([row]))[0] * 0.5 * np.exp(rng.normal(0, 0.002)))


def fill(services: Services, status: str = "done", grid: dict | None = None, leave_out: int = 0) -> str:
    """A submitted sweep whose decay segments are done with an observation each (all but ``leave_out`` of them)."""
    sweep_id = submit(services, parse_spec(grid or GRID), "alice", new=True).id
    rng = np.random.default_rng(0)
    members = [seg for seg, _ in services.store.members(sweep_id) if seg.observation is not None]
    with services.store.transaction() as s:
        for seg in members[:len(members) - leave_out]:
            o = seg.observation
            s.add(ObservationRecord(segment_key=seg.key, kind=o["kind"], N1=o.get("N1"), D1=o.get("D1"),
                                    D2=o.get("D2"), D=o.get("D"), N2=o.get("N2"), N_total=o.get("N_total"),
                                    n_expert=o.get("n_expert"), topk=o.get("topk"), method=o.get("method"),
                                    r=o.get("r"), loss=_loss(o, rng), trunk=seg.trunk or seg.key))
            s.execute(update(SegmentRecord).where(SegmentRecord.key == seg.key).values(status="done"))
    services.store.set_sweep(sweep_id, status=status)
    return sweep_id


def add_last_observation(services: Services, sweep_id: str) -> None:
    """A late segment: the one observation `fill(leave_out=1)` left out arrives."""
    have = {o.segment_key for o in services.store.observations(sweep_id)}
    seg = next(seg for seg, _ in services.store.members(sweep_id) if seg.observation and seg.key not in have)
    o = seg.observation
    with services.store.transaction() as s:
        s.add(ObservationRecord(segment_key=seg.key, kind=o["kind"], N1=o.get("N1"), D1=o.get("D1"), D2=o.get("D2"),
                                D=o.get("D"), N2=o.get("N2"), N_total=o.get("N_total"), n_expert=o.get("n_expert"),
                                topk=o.get("topk"), method=o.get("method"), r=o.get("r"),
                                loss=_loss(o, np.random.default_rng(1)), trunk=seg.trunk or seg.key))


@pytest.fixture()
def services(tmp_path, mlflow_uri) -> Services:
    return open_services(Settings(home=tmp_path, mlflow_tracking_uri=mlflow_uri), auth=False)


def _rows(services: Services) -> list[AnalysisRecord]:
    with services.store.transaction() as s:
        return list(s.scalars(select(AnalysisRecord)))


@pytest.mark.slow  # ~36 s on 2 busy cores (make test stays under 10 minutes)
def test_identical_inputs_make_one_analysis_even_when_triggers_race(services) -> None:
    sid = fill(services)
    results: list[AnalysisRecord] = []
    start = threading.Barrier(3)

    def trigger() -> None:  # none waits for another's work: the running one is named at once
        start.wait()
        try:
            results.append(run_analysis(services, [sid], bootstrap=0, owner="alice", trigger="request"))
        except analyses.AnalysisRunning as e:
            results.append(e.record)

    threads = [threading.Thread(target=trigger, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(results) == 3 and len({r.id for r in results}) == 1
    assert sorted(r.ran for r in results) == [False, False, True]
    (row,) = _rows(services)
    assert row.status == "done" and row.trigger == "request" and row.record["version"] >= 1
    assert row.record["scratch"] is not None and row.record["upcycled"][0]["dstar"] is not None
    again = run_analysis(services, [sid], bootstrap=0, owner="bob", trigger="request")
    assert again.id == row.id and not again.ran  # the same inputs later: the same analysis
    other = run_analysis(services, [sid], bootstrap=0, seed=1, owner="bob", trigger="request")
    assert other.id != row.id and other.ran and len(_rows(services)) == 2  # other parameters: a new one


@pytest.mark.slow  # ~19 s on 2 cores: waits out the staleness; its sibling (process gone) stays quick
def test_a_crashed_running_row_is_taken_over_once_stale(services) -> None:
    sid = fill(services)
    first = run_analysis(services, [sid], bootstrap=0, owner="alice", trigger="request")
    with services.store.transaction() as s:  # as if its process died mid-analysis long ago
        s.execute(update(AnalysisRecord).where(AnalysisRecord.id == first.id)
                  .values(status="running", created_at=first.created_at.replace(year=2000)))
    taken = run_analysis(services, [sid], bootstrap=0, owner="bob", trigger="request")
    assert taken.id == first.id and taken.ran and taken.status == "done" and taken.owner == "bob"


@pytest.mark.slow  # ~43 s on 2 busy cores (make test stays under 10 minutes)
def test_a_running_row_whose_process_is_gone_is_taken_over_at_once(services) -> None:
    sid = fill(services)
    first = run_analysis(services, [sid], bootstrap=0, owner="alice", trigger="request")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with services.store.transaction() as s:  # as if a server (this host, pid `dead`) was killed mid-analysis now
        s.execute(update(AnalysisRecord).where(AnalysisRecord.id == first.id)
                  .values(status="running", runner=f"{socket.gethostname()}:{dead.pid}:abcdef"))
    assert analyses.fail_interrupted(services.store) == [first.id]  # what the loop's tick does first
    (row,) = _rows(services)
    assert row.status == "failed" and row.error.startswith("interrupted") and analyses.interrupted(row)
    again = analyses.analyse_if_new(services, sid, bootstrap=0)  # the loop runs interrupted inputs again
    assert again.ran and again.status == "done" and again.trigger == "observations"


@pytest.mark.slow  # ~17 s on 2 busy cores (make test stays under 10 minutes)
def test_an_interrupted_requested_analysis_runs_again_with_the_parameters_it_was_asked_with(services) -> None:
    """A server stopped mid-request (its jobs' `stop_when` raising): the next loop tick runs that row again with
    the N1s, bootstrap and seed the caller asked for, not the loop's defaults, and the sweep gets no other row."""
    sid = fill(services)
    asked = {"n1s": [2e4], "bootstrap": 2, "seed": 7}

    def stopping(*_: object) -> None:
        raise analyses.Interrupted("the server stopped while it ran")

    with pytest.raises(analyses.Interrupted):
        run_analysis(services, [sid], **asked, owner="alice", trigger="request", progress=stopping)
    (row,) = _rows(services)
    assert row.status == "failed" and analyses.interrupted(row)
    analyses.AnalysisLoop(services, bootstrap=0, policy="on_new_observations").tick()  # the next start's loop
    rows = _rows(services)
    assert [(r.id, r.status, r.trigger) for r in rows] == [(row.id, "done", "request")], [r.params for r in rows]
    assert {k: rows[0].params[k] for k in asked} == asked


def test_unknown_sweep_and_sweep_without_observations(services) -> None:
    from upscale.orchestrator.errors import NotFoundError

    with pytest.raises(NotFoundError):
        run_analysis(services, ["nosuchsweep"], owner="alice", trigger="request")
    empty = submit(services, parse_spec(GRID), "alice", new=True).id
    with pytest.raises(NotReady, match="no finished segments"):
        run_analysis(services, [empty], owner="alice", trigger="request")
    assert _rows(services) == []  # nothing claimed


@pytest.mark.slow  # ~25 s on 2 cores: three analyses by the loop
def test_the_loop_analyses_settled_sweeps_when_their_observations_change(services) -> None:
    running = fill(services, status="running", grid=OTHER_GRID)
    sid = fill(services, leave_out=1)
    loop = AnalysisLoop(services, bootstrap=0)
    loop.tick()
    (first,) = _rows(services)
    assert first.sweep_ids == [sid] and first.trigger == "completed" and first.status == "done"
    loop.tick()
    assert len(_rows(services)) == 1  # nothing changed: nothing run
    add_last_observation(services, sid)
    loop.tick()
    latest = analyses.latest_analysis(services.store, sid)
    assert latest.trigger == "observations"
    assert sum(latest.record["points"].values()) == sum(first.record["points"].values()) + 1
    assert analyses.latest_analysis(services.store, running) is None  # still running: not analysed
    AnalysisLoop(services, bootstrap=0, policy="off").tick()
    services.store.set_sweep(running, status="done")
    AnalysisLoop(services, bootstrap=0, policy="off").tick()
    assert analyses.latest_analysis(services.store, running) is None  # policy off: never by itself


def test_a_failing_analysis_is_recorded_and_not_retried_by_the_loop(services) -> None:
    grid = {**GRID, "name": "one-point", "model": {"sizes": [{"n_layer": 1, "d_model": 16, "n_head": 2}]},
            "tokens": {"d1": [1024], "d2": [512], "scratch": [1024]}}
    sid = fill(services, grid=grid)
    loop = AnalysisLoop(services, bootstrap=0)
    loop.tick()
    rows = _rows(services)
    assert len(rows) == 1 and rows[0].sweep_ids == [sid]
    if rows[0].status == "failed":  # nothing fittable: the error is on the row, and the loop goes on
        assert rows[0].error
    loop.tick()
    assert len(_rows(services)) == 1 and _rows(services)[0].created_at == rows[0].created_at


@pytest.mark.slow  # ~43 s on 2 busy cores (make test stays under 10 minutes)
def test_routes_decisions_and_plots(tmp_path, mlflow_uri) -> None:
    settings = Settings(home=tmp_path, mlflow_tracking_uri=mlflow_uri)
    services = open_services(settings)
    sid = fill(services)
    tree = RunTree.for_settings(settings)  # the sweep's MLflow parent run, as the scheduler makes it
    services.store.set_sweep(sid, mlflow_run_id=(parent := tree.start_sweep(sid, GRID["name"], GRID)))
    empty = submit(services, parse_spec(OTHER_GRID), "alice", new=True).id
    with serve(settings, scheduler=False) as live:
        c = live.client()
        r = c.get("/decisions/upcycle", params={"n1": 1e4, "d1": 1e3, "d2": 1e3})
        assert r.status_code == 409 and "/fits" not in r.text and "no analysis yet" in r.text, r.text
        r = c.get(f"/sweeps/{sid}/analysis")
        assert r.status_code == 409 and f"POST /sweeps/{sid}/analysis runs it now" in r.text
        assert c.get("/sweeps/nosuch/analysis").status_code == 404
        assert c.post("/sweeps/nosuch/analysis", json={}).status_code == 404
        r = c.post(f"/sweeps/{empty}/analysis", json={})
        assert r.status_code == 409 and "no finished segments" in r.text
        assert c.post(f"/sweeps/{sid}/analysis", json={"bootstrap": 501}).status_code == 422
        for bad in ({"n1s": [1e9] * 33}, {"n1s": [-1.0]}, {"seed": 2**40}):  # work a request may cause is bounded
            assert c.post(f"/sweeps/{sid}/analysis", json=bad).status_code == 422, bad
        assert live.client(live.read).post(f"/sweeps/{sid}/analysis", json={}).status_code == 403

        made = c.post(f"/sweeps/{sid}/analysis", json={"bootstrap": 10, "n1s": [2e4]})
        assert made.status_code == 202 and made.json()["status"] == "running", made.text  # it runs off the request
        assert made.headers["location"] == f"/analyses/{made.json()['id']}"
        body = wait_done(c, made.json()["id"])
        assert body["status"] == "done" and body["trigger"] == "request" and body["analysis"]["n1s"] == [2e4]
        assert c.get("/analyses/nosuch").status_code == 404
        same = c.post(f"/sweeps/{sid}/analysis", json={"bootstrap": 10, "n1s": [2e4]})
        assert same.status_code == 200 and same.json()["id"] == body["id"]
        assert c.get(f"/sweeps/{sid}/analysis").json()["id"] == body["id"]
        # ...and it is on the sweep's MLflow parent run, with its plots (logged just after the row is done)
        wait_logged(tree, parent, body["id"])
        in_mlflow = f"analyses/{body['id']}"
        logged = {f.path for f in tree.client.list_artifacts(parent, in_mlflow)}
        assert {f"{in_mlflow}/analysis.json", f"{in_mlflow}/dstar.csv", f"{in_mlflow}/plots"} <= logged, logged
        shown = tree.client.get_run(parent).data.tags  # its single numbers are tags, not one-point charts
        assert float(shown["analysis.E"]) == pytest.approx(body["analysis"]["E"], rel=1e-3)
        assert shown["upscale.analysis.latest"] == body["id"]
        assert [a["id"] for a in c.get(f"/sweeps/{sid}/analyses").json()] == [body["id"]]

        d = c.get("/decisions/upcycle", params={"n1": 2e4, "d1": 1024, "d2": 1024})
        assert d.status_code == 200, d.text
        d = d.json()
        assert d["analysis"]["id"] == body["id"] and d["analysis"]["sweep_ids"] == [sid]
        assert d["analysis"]["age_s"] >= 0 and d["group"] == "naive 4x2" and d["verdict"] in ("upcycle", "scratch")
        assert 0 <= d["probability_upcycle"] <= 1 and "fits" not in d
        assert not d["extrapolation"]["flagged"] and d["health"] in ("ok", "unhealthy")
        far = c.get("/decisions/upcycle", params={"n1": 2e8, "d1": 1024, "d2": 1024})  # 1e4x the sizes trained
        assert far.status_code == 200 and far.json()["extrapolation"]["flagged"], far.text
        assert "N1=2e+08 is 1.21e+04x above the range trained" in far.json()["extrapolation"]["note"]
        insane = c.get("/decisions/upcycle", params={"n1": 10, "d1": 1, "d2": 1})  # a loss no model starts with
        assert insane.status_code == 422 and "untrained model's" in insane.text, insane.text
        assert "range trained" in insane.text
        assert c.get("/decisions/upcycle", params={"n1": 2e4, "d1": 1024, "d2": 1024,
                                                   "sweep_id": sid}).json()["analysis"]["id"] == body["id"]
        r = c.get("/decisions/upcycle", params={"n1": 2e4, "d1": 1024, "d2": 1024, "sweep_id": empty})
        assert r.status_code == 409 and "no finished segments" in r.text
        r = c.get("/decisions/upcycle", params={"n1": 2e4, "d1": 1024, "d2": 1024, "group": "drop 4x2"})
        assert r.status_code == 422 and "naive 4x2" in r.text

        # Plots are served by listed name only: no way out of the analysis's folder.
        folder = analyses.analysis_dir(settings.home, body["id"])
        assert {"dstar", "naive_4x2/parity", "scratch_loss_vs_d"} <= set(body["plots"])  # drawn when it ran
        ok = c.get(f"/sweeps/{sid}/analysis/plots/naive_4x2/parity.png")
        assert ok.status_code == 200 and ok.content == (folder / "naive_4x2" / "parity.png").read_bytes()
        assert ok.content.startswith(b"\x89PNG")
        for bad in ("..%2F..%2Fupscale.db", "..%2Fupscale.db", "naive_4x2%2F..%2F..%2F..%2Fupscale.db",
                    "naive_4x2/parity.txt", "%2Fetc%2Fpasswd"):
            assert c.get(f"/sweeps/{sid}/analysis/plots/{bad}").status_code == 404, bad
        assert c.get(f"/sweeps/{empty}/analysis/plots/naive_4x2/parity.png",
                     params={"analysis_id": body["id"]}).status_code == 404  # another sweep's analysis

        # Refits run the analysis: a schedule naming laws to fit is refused (no such field), an N1 past the
        # analyses' bound too; versions name their analysis.
        bad = c.post("/refit-schedules", json={"name": "x", "trigger": "on_new_observations",
                                               "request": {"sweep_ids": [sid], "laws": {"upcycled": "data-mul"}}})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "request", "laws"]
        huge = c.post("/refit-schedules", json={"name": "x", "trigger": "on_new_observations",
                                                "request": {"sweep_ids": [sid], "n1": 1e308}})
        assert huge.status_code == 422 and huge.json()["detail"][0]["loc"] == ["body", "request", "n1"], huge.text
        schedule = c.post("/refit-schedules", json={"name": "a", "trigger": "on_new_observations",
                                                    "request": {"sweep_ids": [sid], "n1": 2e4, "bootstrap": 10}})
        assert schedule.status_code == 201, schedule.text
        v1 = c.post(f"/refit-schedules/{schedule.json()['id']}/run")
        again = c.post(f"/refit-schedules/{schedule.json()['id']}/run")
        assert (v1.status_code, again.status_code) == (201, 200)  # same inputs: no second version...
        v1, again = v1.json(), again.json()
        assert again == {**v1, "unchanged": True} and not v1["unchanged"]
        assert v1["analysis_id"] != body["id"]  # ...and its analysis is the owner's, never the sweep's own
        assert c.get("/decisions/upcycle", params={"n1": 2e4, "d1": 1024, "d2": 1024,
                                                   "sweep_id": sid}).json()["analysis"]["id"] == body["id"]
        answer = body["analysis"]["upcycled"][0]["dstar"]["results"][0]
        assert v1["dstar"] == (None if answer["dstar"] is None else pytest.approx(answer["dstar"]))
        assert v1["dstar_answer"]["dstar_state"] == answer["dstar_state"] and v1["dstar_answer"]["n1"] == 2e4
        assert v1["dstar_group"] == "naive 4x2" and v1["version"] == 1 and v1["diff"] == {}


def wait_done(c, analysis_id: str, timeout_s: float = 300) -> dict:
    """Poll GET /analyses/{id} until the analysis is no longer running; its last state."""
    deadline = time.monotonic() + timeout_s
    while (record := c.get(f"/analyses/{analysis_id}").json())["status"] == "running":
        assert time.monotonic() < deadline, f"analysis {analysis_id} still running"
        time.sleep(0.2)
    return record


def wait_logged(tree: RunTree, run_id: str, analysis_id: str, timeout_s: float = 60) -> None:
    """Poll the sweep's MLflow run until it shows ``analysis_id``: the row is done before MLflow has it, and the
    pointer tag is the last thing control/analysis_run.py logs."""
    deadline = time.monotonic() + timeout_s
    while tree.client.get_run(run_id).data.tags.get("upscale.analysis.latest") != analysis_id:
        assert time.monotonic() < deadline, f"analysis {analysis_id} never reached MLflow run {run_id}"
        time.sleep(0.2)


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "UPSCALE_HOME": str(home), "COLUMNS": "200"}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([str(UPSCALE), *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow  # six console-script runs: ~22 s on 2 cores
def test_upscale_analyze_prints_and_stores_the_analysis(tmp_path, mlflow_uri) -> None:
    services = open_services(Settings(home=tmp_path, mlflow_tracking_uri=mlflow_uri))
    sid = fill(services)
    empty = submit(services, parse_spec(OTHER_GRID), "alice", new=True).id
    short = _cli(tmp_path, "analyze", sid, "--bootstrap", "0", "--n1", "2e4")
    assert short.returncode == 0 and "upscale analysis (" in short.stdout and "--details" in short.stdout, short.stderr
    assert "upcycling method:" not in short.stdout  # the summary first; the detail behind --details
    out = _cli(tmp_path, "analyze", sid, "--bootstrap", "0", "--n1", "2e4", "--details")
    assert out.returncode == 0, out.stderr
    assert "MoE from scratch" in out.stdout and "upcycling method: naive 4x2" in out.stdout and "D*" in out.stdout
    assert out.stdout.count("verdict:") == 2
    as_json = json.loads(_cli(tmp_path, "analyze", sid, "--bootstrap", "0", "--n1", "2e4", "--json").stdout)
    stored = analyses.latest_analysis(services.store, sid)
    assert as_json["id"] == stored.id and as_json["sweep_ids"] == [sid] and as_json["analysis"] == stored.record
    assert as_json["plots"] == stored.plots
    decided = _cli(tmp_path, "decide", "--n1", "2e4", "--d1", "1024", "--d2", "1024", "--json")
    assert decided.returncode == 0, decided.stderr
    assert json.loads(decided.stdout)["analysis"]["id"] == stored.id and f"analysis {stored.id}" in decided.stderr
    star = _cli(tmp_path, "dstar", "--n1", "2e4", "--json")
    assert star.returncode == 0 and json.loads(star.stdout)["results"][0]["dstar"] == pytest.approx(
        stored.record["upcycled"][0]["dstar"]["results"][0]["dstar"])
    bad = _cli(tmp_path, "analyze", empty)
    assert bad.returncode == 2 and bad.stderr.startswith("error:") and "no finished segments" in bad.stderr
    assert _cli(tmp_path, "analyze", "nosuch").returncode == 2


def test_a_deleted_refit_schedule_runs_no_more(tmp_path, mlflow_uri) -> None:
    """DELETE stops a schedule for good: running it on demand afterwards is 404 and records no version."""
    settings = Settings(home=tmp_path, mlflow_tracking_uri=mlflow_uri)
    sid = fill(open_services(settings))
    with serve(settings, scheduler=False) as live:
        c = live.client()
        schedule = c.post("/refit-schedules", json={"name": "gone", "trigger": "on_new_observations",
                                                    "request": {"sweep_ids": [sid], "bootstrap": 0}}).json()
        assert c.delete(f"/refit-schedules/{schedule['id']}").status_code == 204
        r = c.post(f"/refit-schedules/{schedule['id']}/run")
        assert r.status_code == 404 and "was deleted" in r.json()["detail"], r.text
        assert c.get("/refits", params={"schedule_id": schedule["id"]}).json() == []


@pytest.mark.slow  # an analysis with its plots (~10 s on 2 cores), a server, two console-script runs
def test_an_expansion_study_reaches_rest_as_the_record_has_it(tmp_path, mlflow_uri) -> None:
    """Expanded observations in the service's analysis: the study's D*_expand, its plot, GET /analyses/{id}
    giving the record back as `Analysis.from_json` reads it, and GET /decisions/expand and `upscale decide --expand`
    answering as the study's Python object does, in an expansion's words."""
    from tests.fitting.expansion_tables import expansion_tables
    from upscale.fitting.analysis import Analysis

    settings = Settings(home=tmp_path, mlflow_tracking_uri=mlflow_uri)
    services = open_services(settings)
    tables = {**expansion_tables(), "dense": pd.DataFrame(columns=["N", "D", "loss"]),
              "upcycled": pd.DataFrame(columns=["N1", "D1", "D2", "loss"])}
    record = run_analysis(services, [], bootstrap=0, owner="alice", trigger="demo", tables=tables)
    assert record.status == "done" and "expand_4x1_8x1_uniform/dstar" in record.plots, record.error
    question = {"n1": 5e4, "d1": 2e5, "d2": 2e5}
    with serve(settings, scheduler=False) as live:
        c = live.client()
        body = c.get(f"/analyses/{record.id}").json()
        decided = c.get("/decisions/expand", params=question)
        unknown = c.get("/decisions/expand", params={**question, "study": "expand 4x1 -> 16x1 uniform"})
        no_upcycling = c.get("/decisions/upcycle", params=question)
    (study,) = body["analysis"]["expansions"]
    assert study["label"] == "expand 4x1 -> 8x1 uniform" and study["missing"] == []
    assert study["analysis"]["upcycled"][0]["dstar"]["results"]
    assert Analysis.from_json(body["analysis"]).expansions[0].to_json() == study
    answer = decided.json()
    assert decided.status_code == 200 and answer["group"] == study["label"], decided.text
    assert answer["analysis"]["id"] == record.id and answer["verdict"] in ("expand", "scratch", "undecided")
    python = Analysis.from_json(body["analysis"]).expansions[0].decision(**question)
    assert {k: answer[k] for k in ("verdict", "dstar", "loss_upcycled")} == \
        {k: python[k] for k in ("verdict", "dstar", "loss_upcycled")}
    words = [answer["dstar_interval_note"], answer["dstar_answer"]["distance"]["note"],
             (answer["dstar_answer"]["next"] or {}).get("runs", "")]
    assert not any("upcycl" in w for w in words) and "expand" in " ".join(words), words
    assert unknown.status_code == 422 and "'expand 4x1 -> 8x1 uniform'" in unknown.text, unknown.text
    assert no_upcycling.status_code == 409 and "no upcycled law" in no_upcycling.text, no_upcycling.text
    cli = _cli(tmp_path, "decide", "--expand", "--n1", "5e4", "--d1", "2e5", "--d2", "2e5")
    assert cli.returncode == 0 and f"study {study['label']!r}" in cli.stderr, cli.stderr
    assert "expanded loss after D2=" in cli.stdout and "D*_expand at N1=" in cli.stdout, cli.stdout
    mixed = _cli(tmp_path, "decide", "--study", study["label"], "--n1", "5e4", "--d1", "2e5", "--d2", "2e5")
    assert mixed.returncode == 2 and "--study (with --expand)" in mixed.stderr, mixed.stderr
