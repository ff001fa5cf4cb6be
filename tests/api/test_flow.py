"""The whole flow on a live server that runs its own scheduler threads: submit a tiny sweep that trains for real on
embedded Ray (nano model, context 16, a few steps per segment), watch its progress, read its observations as JSON and
CSV, fit a law on them, see an `on_new_observations` refit run the analysis and record versions, decide from fits, and
find the sweep's run tree in MLflow. Values are checked against the planner and against fitting/ called directly."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from tests.api.conftest import serve
from upscale.control.analysis_run import ANALYSIS_ID
from upscale.control.refits import RefitLoop
from upscale.control.wiring import open_services
from upscale.fitting.data import read_table
from upscale.fitting.synthetic import bundled_path
from upscale.orchestrator.settings import Settings
from upscale.sweeps.loader import load_spec
from upscale.sweeps.planner import plan

FLOW_SPEC = """
name: api-flow
model: {sizes: [nano]}
moe: {experts: [2], topk: [1]}
upcycling: {methods: [naive]}
tokens: {d1: [256, 512], d2: [128, 256, 384]}
train: {context: 16, batch_size: 4, lr: {dense: 3.0e-3, moe: 2.0e-3}, warmup_tokens: 64}
data: {corpus: "builtin:python-stdlib", tokenizer: bytes, eval_tokens: 512}
resources: {cpus: 1}
"""


# Slow as a module: the end-to-end flow trains 18 real segments (~175 s on 2 cores) and the cron test reads the
# sweep it leaves.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def flow(tmp_path_factory, mlflow_uri, ray_session):
    settings = Settings(home=tmp_path_factory.mktemp("flow"), mlflow_tracking_uri=mlflow_uri)
    with serve(settings, refit_tick_s=0.5, poll_s=0.2) as server:
        yield server


def wait_for(fn, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_submit_train_observe_fit_refit_decide(flow) -> None:
    c = flow.client()
    created = c.post("/sweeps", content=FLOW_SPEC, headers={"content-type": "application/yaml"}).json()
    sid = created["id"]
    planned = plan(load_spec(FLOW_SPEC))
    assert created["plan"]["segments"] == len(planned.segments) == 18
    schedule = c.post("/refit-schedules", json={
        "name": "analysis on arrival", "trigger": "on_new_observations",
        "request": {"sweep_ids": [sid], "bootstrap": 0}}).json()

    seen = set()

    def finished():
        d = c.get(f"/sweeps/{sid}").json()
        seen.update(s["status"] for s in d["segments"])
        return d if d["status"] in ("done", "failed") else None

    detail = wait_for(finished, 240, "the sweep to finish")
    assert detail["status"] == "done", detail
    assert detail["by_status"] == {"done": 18} and detail["segments_done"] == 18
    assert detail["flops_done"] == detail["flops_planned"] == pytest.approx(planned.total_flops)
    assert "running" in seen or "pending" in seen  # progress was visible before the end

    rows = c.get(f"/sweeps/{sid}/observations").json()
    up = sorted((r["D1"], r["D2"]) for r in rows if r["kind"] == "upcycled")
    assert up == [(d1, d2) for d1 in (256, 512) for d2 in (128, 256, 384)]
    assert all(r["loss"] > 0 and r["mlflow_run_id"] for r in rows) and len(rows) == 8
    csv = pd.read_csv(io.StringIO(c.get(f"/sweeps/{sid}/observations?format=csv").text))
    assert list(csv["loss"]) == [r["loss"] for r in rows]

    fit = c.post("/fits", json={"law": "data-mul-noint", "kind": "upcycled", "sweep_ids": [sid]})
    assert fit.status_code == 201, fit.text
    fit = fit.json()
    assert fit["report"]["n_points"] == 6 and set(fit["report"]["params"]) == {"A", "alpha1", "alpha2", "E"}
    png = c.get(fit["plots"]["parity"])
    assert png.status_code == 200 and png.content.startswith(b"\x89PNG")
    assert c.get(f"/fits/{fit['id']}").json()["data_hash"] == fit["data_hash"]

    def refitted_all():  # the schedule fires on every change of the observations: wait for the last one
        versions = c.get("/refits", params={"schedule_id": schedule["id"]}).json()
        if not versions:
            return None
        ran = {a["id"]: a for a in c.get(f"/sweeps/{sid}/analyses").json()}[versions[-1]["analysis_id"]]
        return versions if sum(ran["analysis"]["points"].values()) == len(rows) else None

    versions = wait_for(refitted_all, 60, "the scheduled refit of every observation")
    first, last = versions[0], versions[-1]
    assert [v["version"] for v in versions] == list(range(1, len(versions) + 1)) and first["diff"] == {}
    assert len(last["inputs_hash"]) == 64
    refit_analysis = next(a for a in c.get(f"/sweeps/{sid}/analyses").json() if a["id"] == last["analysis_id"])
    assert refit_analysis["trigger"] == "refit" and refit_analysis["status"] == "done"
    again = c.post(f"/refit-schedules/{schedule['id']}/run")
    assert again.status_code == 200 and again.json() == {**last, "unchanged": True}  # the same inputs: no new version

    client = MlflowClient(flow.settings.mlflow_tracking_uri)
    parent = client.get_run(detail["mlflow_run_id"])
    assert parent.data.tags["upscale.sweep_id"] == sid and parent.info.status == "FINISHED"
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert {r.info.run_id for r in children} >= {s["mlflow_run_id"] for s in rows}
    segment_runs = [r for r in children if ANALYSIS_ID not in r.data.tags]  # each refit's analysis has a run too
    assert len(segment_runs) == 18 and all(r.info.status == "FINISHED" for r in segment_runs)
    assert {r.data.tags[ANALYSIS_ID] for r in children if ANALYSIS_ID in r.data.tags} == {
        v["analysis_id"] for v in versions}
    metrics = c.get("/metrics").text
    assert 'upscale_segments{state="done"} 18.0' in metrics and "upscale_refit_age_seconds NaN" not in metrics


def test_decisions_answer_from_the_analysis_only(flow) -> None:
    """Stored fits are kept and served, but a decision has one road: the newest analysis. The flow's one-size sweep
    has no from-scratch law, so the answer is a 409 saying so, with or without naming fits (no such parameter)."""
    c = flow.client()
    rows = read_table(bundled_path("moe")).to_dict(orient="records")
    r = c.post("/fits", json={"law": "chinchilla", "kind": "scratch", "rows": rows})
    assert r.status_code == 201, r.text
    assert c.get(f"/fits/{r.json()['id']}").json()["law"] == "chinchilla"
    params = c.get("/openapi.json").json()["paths"]["/decisions/upcycle"]["get"]["parameters"]
    assert {p["name"] for p in params} == {"n1", "d1", "d2", "sweep_id", "group"}
    for extra in ({}, {"moe_fit": r.json()["id"]}):
        d = c.get("/decisions/upcycle", params={"n1": 1e9, "d1": 1e9, "d2": 1e9, **extra})
        assert d.status_code == 409 and "from-scratch" in d.json()["detail"], d.text
    # `upscale decide --api` is this endpoint from the command line (a read token is enough): one error line.
    token = flow.read["Authorization"].split()[1]
    cli = subprocess.run([str(Path(sys.executable).parent / "upscale"), "decide", "--n1", "1e9", "--d1", "1e9",
                          "--d2", "1e9", "--api", flow.url, "--token", token, "--json"],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 2 and cli.stderr.startswith("error:") and "409" in cli.stderr, cli.stderr


def test_cron_schedule_fires_once_per_matching_minute(flow) -> None:
    c = flow.client()
    sid = next(s["id"] for s in c.get("/sweeps").json() if s["status"] == "done")
    schedule = c.post("/refit-schedules", json={
        "name": "every minute", "trigger": "cron", "cron": "* * * * *",
        "request": {"sweep_ids": [sid], "bootstrap": 0}}).json()
    first = wait_for(lambda: c.get("/refits", params={"schedule_id": schedule["id"]}).json(), 30, "the cron refit")
    time.sleep(2.0)  # four more ticks of the server's refit loop
    versions = c.get("/refits", params={"schedule_id": schedule["id"]}).json()
    if time.gmtime().tm_min == int(first[0]["created_at"][14:16]):  # still the minute it fired in
        assert [v["version"] for v in versions] == [1]
    RefitLoop(open_services(flow.settings)).tick()  # a second loop (e.g. `upscale scheduler`) does not fire it again
    assert len(c.get("/refits", params={"schedule_id": schedule["id"]}).json()) <= len(versions) + (
        time.gmtime().tm_min != int(first[0]["created_at"][14:16]))
    assert c.delete(f"/refit-schedules/{schedule['id']}").status_code == 204
    assert schedule["id"] not in {s["id"] for s in c.get("/refit-schedules").json()}
    assert c.get("/refits", params={"schedule_id": schedule["id"]}).json() == versions  # history kept
    bad = c.post("/refit-schedules", json={"name": "x", "trigger": "cron", "cron": "61 * * * *",
                                           "request": {"sweep_ids": [sid]}})
    assert bad.status_code == 422 and "minute" in bad.text
