"""A real MLflow tracking server on a PostgreSQL backend receives a sweep's run tree over HTTP, as in deployment
(deploy/docker-compose.yml runs the same command).

Strategy: start `mlflow server` on loopback on a free port with its backend in a fresh database of the test
PostgreSQL server and a proxied artifact directory; run the micro sweep (7 segments) through the orchestrator with
the counting segment function and MLFLOW_TRACKING_URI = the server's http:// URL; then read everything back through
the same server with MlflowClient, and count the rows in PostgreSQL itself to prove that is where they went."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from mlflow.tracking import MlflowClient

from tests.deploy.conftest import MICRO_SPEC, libpq
from tests.orchestrator.segment_fns import counting_segment
from upscale.orchestrator.scheduler import Scheduler
from upscale.orchestrator.service import Orchestrator
from upscale.orchestrator.settings import Settings
from upscale.sweeps.spec import load_spec

pytestmark = pytest.mark.postgres


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mlflow_server(postgres_url: str, tmp_path: Path) -> Iterator[str]:
    """`mlflow server` with a PostgreSQL backend; yields its http:// URL once /health answers."""
    port = free_port()
    log = open(tmp_path / "mlflow-server.log", "w")  # noqa: SIM115  (open while the server runs)
    mlflow = Path(sys.executable).parent / "mlflow"
    proc = subprocess.Popen([str(mlflow), "server", "--backend-store-uri", postgres_url,
                             "--artifacts-destination", str(tmp_path / "mlartifacts"), "--serve-artifacts",
                             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            start_new_session=True)
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
                raise RuntimeError(f"mlflow server did not start:\n{(tmp_path / 'mlflow-server.log').read_text()}")
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, 15)  # its gunicorn/uvicorn workers are in its session
        proc.wait(timeout=30)
        log.close()


def test_a_sweeps_runs_reach_the_tracking_server_over_http(postgres_url: str, mlflow_server: str, tmp_path: Path,
                                                           ray_session) -> None:
    settings = Settings(home=tmp_path / "home", mlflow_tracking_uri=mlflow_server)
    orch = Orchestrator.open(settings)
    out = orch.run(load_spec(MICRO_SPEC), Scheduler(orch.store, settings, segment_fn=counting_segment, poll_s=0.05))
    assert out.status == "done" and len(out.trained) == 7

    client = MlflowClient(mlflow_server)
    sweep = orch.store.sweep(out.sweep_id)
    parent = client.get_run(sweep.mlflow_run_id)
    assert parent.info.status == "FINISHED" and parent.data.metrics["segments_trained"] == 7
    assert client.list_artifacts(parent.info.run_id)[0].path == "sweep.json"  # proxied to the artifact directory
    assert (tmp_path / "mlartifacts").is_dir()
    assert client.download_artifacts(parent.info.run_id, "sweep.json", str(tmp_path))
    experiment = client.get_experiment_by_name("upscale").experiment_id
    children = client.search_runs([experiment], f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
                                  max_results=100)
    assert len(children) == 7 and {r.info.status for r in children} == {"FINISHED"}
    for o in orch.store.observations(out.sweep_id):
        run = client.get_run(o.mlflow_run_id)
        assert run.data.metrics["val_loss"] == pytest.approx(o.loss)
        assert run.data.tags["upscale.segment_id"] == o.segment_key and run.data.tags["axis.D2" if o.D2 else "axis.D"]
    with psycopg.connect(libpq(postgres_url)) as conn:  # the server wrote them to PostgreSQL
        assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 8
