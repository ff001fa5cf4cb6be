"""The CLI against a real `upscale serve` subprocess (console script, loopback port, temporary UPSCALE_HOME):
token create, submit and status over `--api`, status in-process on the same store, ui; and a graceful SIGTERM
while a sweep trains leaves no segment running and the sweep pending, to resume on the next start (slow)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import free_port
from tests.api.test_flow import FLOW_SPEC
from upscale.control.wiring import open_services
from upscale.orchestrator.settings import Settings

UPSCALE = str(Path(sys.executable).parent / "upscale")


def _env(home: Path, mlflow_uri: str) -> dict[str, str]:
    return {**os.environ, "UPSCALE_HOME": str(home), "MLFLOW_TRACKING_URI": mlflow_uri, "UPSCALE_TOKEN": ""}


def _stop(proc: subprocess.Popen, timeout_s: float) -> str:
    """SIGTERM; uvicorn shuts down gracefully, then re-raises the signal (so the exit status is -15). Returns what
    the server printed."""
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=timeout_s)
    assert "Application shutdown complete" in out, out[-3000:]
    return out


def _cli(env: dict[str, str], *args: str) -> str:
    r = subprocess.run([UPSCALE, *args], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def _start(env: dict[str, str], *args: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([UPSCALE, "serve", "--port", str(port), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
        try:
            if httpx.get(f"{url}/healthz").status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.3)


@pytest.mark.slow  # ~24 s on 2 cores: a real server and a dozen console-script runs
def test_cli_over_http_and_in_process(tmp_path, mlflow_uri) -> None:
    env = _env(tmp_path, mlflow_uri)
    token = _cli(env, "token", "create", "--scope", "write", "carol").strip()
    spec = tmp_path / "flow.yaml"
    spec.write_text(FLOW_SPEC)
    proc, url = _start(env, "--no-scheduler")
    try:
        r = subprocess.run([UPSCALE, "submit", str(spec), "--api", url], env=env, capture_output=True, text=True)
        assert r.returncode == 2 and "401" in r.stderr  # no token
        out = _cli(env, "submit", str(spec), "--api", url, "--token", token)
        assert "plan api-flow: 18 segments" in out and "not yet in the store: 18 of 18 segments" in out
        sweep_id = out.split()[1]
        assert sweep_id in _cli(env, "status", "--api", url, "--token", token)
        # queued, nothing reused: all 18 to train, the time left the plan's whole estimate
        status = _cli(env, "status", sweep_id, "--api", url, "--token", token)
        assert "trains 18 segment(s) (0 done), reuses 0; planned " in status and "time left 0:" in status, status
        assert "carol" in httpx.get(f"{url}/sweeps/{sweep_id}", headers={"Authorization": f"Bearer {token}"}).text
        # Nothing trained yet (no scheduler): the table `upscale fit` reads, with its header and no rows.
        csv = _cli(env, "observations", sweep_id, "--csv", "--kind", "upcycled", "--api", url, "--token", token)
        assert csv.splitlines()[0].startswith("kind,N,D,N1,D1,D2") and len(csv.splitlines()) == 1
        assert _cli(env, "cancel", sweep_id, "--api", url, "--token", token).strip() == f"sweep {sweep_id}: cancelled"
    finally:
        served = _stop(proc, 30)
    # what `upscale serve` starts, said before it listens
    assert served.index("upscale serve: store sqlite:///") < served.index("upscale serve: starting the API on "
                                                                         f"{url}"), served[-3000:]
    local = _cli(env, "status", sweep_id)  # in-process, on the same store, no token
    assert "pending" in local and "0 of" in local
    assert _cli(env, "ui").split()[1:] == ["-m", "mlflow", "ui", "--backend-store-uri", mlflow_uri, "--port", "5000",
                                          "--app-name", "upscale"]


@pytest.mark.slow
def test_sigterm_while_training_releases_segments(tmp_path, mlflow_uri) -> None:
    env = _env(tmp_path, mlflow_uri)
    token = _cli(env, "token", "create", "--scope", "write").strip()
    proc, url = _start(env)
    headers = {"Authorization": f"Bearer {token}"}
    try:
        sid = httpx.post(f"{url}/sweeps", content=FLOW_SPEC, headers={**headers, "content-type": "application/yaml"}
                         ).json()["id"]
        deadline = time.monotonic() + 120
        while httpx.get(f"{url}/sweeps/{sid}", headers=headers).json()["by_status"].get("running", 0) == 0:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        _stop(proc, 90)
    store = open_services(Settings(home=tmp_path, mlflow_tracking_uri=mlflow_uri)).store
    assert store.sweep(sid).status == "pending"
    statuses = [seg.status for seg, _ in store.members(sid)]
    assert "running" not in statuses and statuses.count("pending") >= 1
