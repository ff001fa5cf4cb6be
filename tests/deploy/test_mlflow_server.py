"""A real MLflow tracking server receives sweeps' run trees over HTTP, as in deployment (deploy/docker-compose.yml
runs the same command), and shows what a user browsing the MLflow UI needs.

Strategy: start `mlflow server` on loopback on a free port with a proxied artifact directory and its backend either
in a fresh database of the test PostgreSQL server (marked postgres) or in a SQLite file (runs everywhere); run the
micro sweep (7 segments) through the orchestrator with the counting segment function (which logs a loss curve
through the worker's MetricLogger) and MLFLOW_TRACKING_URI = the server's http:// URL; then read everything back
through the same server with MlflowClient. On SQLite the same spec runs twice, so the second sweep reuses all seven
segments, and an analysis of the bundled synthetic tables is logged to the parent, all from a working directory
that must stay empty."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from mlflow.tracking import MlflowClient

from tests.deploy.conftest import MICRO_SPEC, libpq
from tests.orchestrator.segment_fns import counting_segment
from upscale.control.analysis_run import AnalysisMeta, log_analysis
from upscale.orchestrator.observations import table
from upscale.orchestrator.scheduler import Scheduler
from upscale.orchestrator.service import Orchestrator
from upscale.orchestrator.settings import Settings
from upscale.orchestrator.tracking import RunTree
from upscale.sweeps.loader import load_spec


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(backend_uri: str, folder: Path) -> Iterator[str]:
    """`mlflow server` on ``backend_uri`` with proxied artifacts in ``folder``; yields its http:// URL once /health
    answers, and stops it (and its workers) afterwards."""
    port = free_port()
    log = open(folder / "mlflow-server.log", "w")  # noqa: SIM115  (open while the server runs)
    mlflow = Path(sys.executable).parent / "mlflow"
    proc = subprocess.Popen([str(mlflow), "server", "--backend-store-uri", backend_uri,
                             "--artifacts-destination", str(folder / "mlartifacts"), "--serve-artifacts",
                             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            cwd=folder, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120  # schema migrations on a new database take a while on 2 shared cores
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server did not start:\n{(folder / 'mlflow-server.log').read_text()}")
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, 15)  # its gunicorn/uvicorn workers are in its session
        proc.wait(timeout=30)
        log.close()


@pytest.fixture
def mlflow_server(postgres_url: str, tmp_path: Path) -> Iterator[str]:
    with serve(postgres_url, tmp_path) as url:
        yield url


@pytest.fixture
def mlflow_sqlite_server(tmp_path: Path) -> Iterator[str]:
    server = tmp_path / "server"
    server.mkdir()
    with serve(f"sqlite:///{server / 'mlflow.db'}", server) as url:
        yield url


def children(client: MlflowClient, parent_run_id: str) -> list:
    experiment = client.get_experiment_by_name("upscale").experiment_id
    return client.search_runs([experiment], f"tags.mlflow.parentRunId = '{parent_run_id}'", max_results=100)


def assert_true_curves(client: MlflowClient, run) -> None:
    """Every metric of ``run``, in the order it was logged, moves forward in tokens: never back to step 0."""
    for key in run.data.metrics:
        history = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.timestamp)
        steps = [m.step for m in history]
        assert steps == sorted(steps), (run.info.run_name, key, steps)
        assert not (len(steps) > 1 and steps[-1] == 0), (run.info.run_name, key, steps)


@pytest.mark.postgres
@pytest.mark.slow  # ~23 s on CI's 2 cores (make test stays under 10 minutes)
def test_a_sweeps_runs_reach_the_tracking_server_over_http(postgres_url: str, mlflow_server: str, tmp_path: Path,
                                                           ray_session) -> None:
    settings = Settings(home=tmp_path / "home", mlflow_tracking_uri=mlflow_server)
    orch = Orchestrator.open(settings)
    out = orch.run(load_spec(MICRO_SPEC), Scheduler(orch.store, settings, segment_fn=counting_segment, poll_s=0.05))
    assert out.status == "done" and len(out.trained) == 7

    client = MlflowClient(mlflow_server)
    sweep = orch.store.sweep(out.sweep_id)
    parent = client.get_run(sweep.mlflow_run_id)
    assert parent.info.status == "FINISHED" and parent.data.metrics["sweep/segments_trained"] == 7
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {"sweep.json", "observations.csv"}
    assert (tmp_path / "mlartifacts").is_dir()
    assert client.download_artifacts(parent.info.run_id, "sweep.json", str(tmp_path))
    experiment = client.get_experiment_by_name("upscale").experiment_id
    children = client.search_runs([experiment], f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
                                  max_results=100)
    assert len(children) == 7 and {r.info.status for r in children} == {"FINISHED"}
    for o in orch.store.observations(out.sweep_id):
        run = client.get_run(o.mlflow_run_id)
        assert run.data.metrics["summary/val_loss"] == pytest.approx(o.loss)
        assert run.data.tags["upscale.segment_id"] == o.segment_key and run.data.params["D2" if o.D2 else "D"]
    with psycopg.connect(libpq(postgres_url)) as conn:  # the server wrote them to PostgreSQL
        assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 8


@pytest.mark.slow  # an MLflow server and a trained sweep: ~130 s on 2 cores
def test_the_mlflow_ui_shows_each_sweep_its_params_curves_analysis_and_reused_segments(
        mlflow_sqlite_server: str, tmp_path: Path, ray_session, monkeypatch: pytest.MonkeyPatch) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    settings = Settings(home=tmp_path / "home", mlflow_tracking_uri=mlflow_sqlite_server)
    orch = Orchestrator.open(settings)
    first = orch.run(load_spec(MICRO_SPEC), Scheduler(orch.store, settings, segment_fn=counting_segment, poll_s=0.05))
    second = orch.run(load_spec(MICRO_SPEC), Scheduler(orch.store, settings, segment_fn=counting_segment, poll_s=0.05))
    assert first.status == second.status == "done" and len(first.trained) == 7 and second.trained == []

    client = MlflowClient(mlflow_sqlite_server)
    experiment = client.get_experiment_by_name("upscale")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"  # the model-training view
    parents = [client.get_run(orch.store.sweep(o.sweep_id).mlflow_run_id) for o in (first, second)]
    assert all(p.info.run_name.startswith("micro (") for p in parents)
    trained = children(client, parents[0].info.run_id)
    assert len(trained) == 7
    for run in trained:  # params, not tags; a name made of kind and axes; curves over tokens
        assert " · nano N1 " in run.info.run_name
        assert run.data.tags["upscale.segment_id"] not in run.info.run_name
        assert {"size", "N1", "n_expert", "topk", "context", "seed", "end_tokens"} <= set(run.data.params)
        assert_true_curves(client, run)
    decay = next(r for r in trained if r.data.params["kind"] == "moe_decay")
    assert decay.info.run_name == "upcycled naive 4x1 · nano N1 32.9k · D1 512 · D2 256 · decay"
    assert decay.data.params["method"] == "naive" and decay.data.params["lr"] == "0.002"
    trunk = next(r for r in trained if r.data.params["kind"] == "dense_trunk")
    curve = client.get_metric_history(trunk.info.run_id, "loss/train")  # logged by the worker, step = tokens seen
    assert [m.step for m in curve] == list(range(64, int(trunk.data.params["end_tokens"]) + 1, 64))

    # the second sweep trained nothing, and its tree is complete: each segment as a child linking its trained run
    reused = children(client, parents[1].info.run_id)
    by_source = {r.data.tags["upscale.trained_in_run"]: r for r in reused}
    assert len(reused) == 7 and set(by_source) == {r.info.run_id for r in trained}
    for run in trained:
        copy = by_source[run.info.run_id]
        assert copy.info.run_name == run.info.run_name + " (reused)" and copy.data.params == run.data.params
        assert copy.data.tags["upscale.role"] == "reused" and run.info.run_id in copy.data.tags["mlflow.note.content"]
        assert copy.data.metrics.get("summary/val_loss") == run.data.metrics.get("summary/val_loss")

    # the sweep's own analyses land on its parent, each under its own folder: record, tables, plots (subfolders
    # kept); the newer one is shown, with its numbers as tags and D* as curves over N1
    record = synthetic_record()
    plots = tmp_path / "plots"
    (plots / "naive_4x1").mkdir(parents=True)
    png = draw_png(plots / "naive_4x1" / "catch_up.png")
    tree = RunTree.for_settings(settings)
    observations = table(orch.store.observations(second.sweep_id))
    run_id = parents[1].info.run_id
    for n, analysis_id in enumerate(("first0", "second1")):
        meta = AnalysisMeta(analysis_id, [second.sweep_id], "request", "alice", datetime(2025, 1, 1 + n, tzinfo=UTC))
        assert log_analysis(tree, [(second.sweep_id, run_id)], meta, record, observations, plots) == run_id
    files = {a.path for a in client.list_artifacts(run_id, "analyses/second1")}
    assert {f"analyses/second1/{name}" for name in ("analysis.json", "dstar.csv", "observations.csv", "verdicts.csv",
                                                    "plots")} <= files
    assert {a.path for a in client.list_artifacts(run_id, "analyses")} == {"analyses/first0", "analyses/second1"}
    assert client.list_artifacts(run_id, "analyses/second1/plots/naive_4x1")[0].path.endswith("catch_up.png")
    analysis = client.download_artifacts(run_id, "analyses/second1/analysis.json", str(tmp_path))
    assert json.loads(Path(analysis).read_text())["E"] == record["E"]
    back = Path(client.download_artifacts(run_id, "analyses/second1/plots/naive_4x1/catch_up.png", str(tmp_path)))
    assert back.read_bytes() == png
    parent = client.get_run(run_id)
    assert parent.data.tags["upscale.analysis.count"] == "2"
    assert float(parent.data.tags["analysis.E"]) == pytest.approx(record["E"], rel=1e-3)
    dstar = [k for k in parent.data.metrics if k.startswith("dstar/") and k.endswith("/low_80")]
    assert dstar and "D*" in parent.data.tags["mlflow.note.content"] and "second1" in parent.data.tags[
        "mlflow.note.content"]
    assert {d.dataset.name for d in parent.inputs.dataset_inputs} == {"observations"}
    assert sorted(os.listdir(cwd)) == []  # no ./mlruns, no ./mlartifacts: the working directory stays untouched


def synthetic_record() -> dict:
    """An analysis record of the bundled synthetic tables (what the demo's --synthetic analyses), bootstrap small."""
    from upscale.fitting.analysis import analyze
    from upscale.fitting.data import read_table
    from upscale.fitting.synthetic import bundled_path

    tables = {kind: read_table(bundled_path(name)) for kind, name in
              (("dense", "dense"), ("scratch", "moe"), ("upcycled", "upcycled"))}
    return analyze(tables, [1e8, 1e9], bootstrap=8).to_json()


def draw_png(path: Path) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([1, 2, 3], [3, 2, 2.5])
    fig.savefig(path)
    plt.close(fig)
    return path.read_bytes()
