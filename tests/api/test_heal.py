"""/healthz reports supervision (each background loop's liveness, Ray's health) and answers 503 when either is down;
a real `upscale serve` whose embedded raylet (or raylet and GCS, as a `ray stop` on the host would) is killed
mid-sweep restarts Ray and finishes the sweep by itself, having refused submissions with a 503 while the cluster was
down, spent no segment's attempts, and outlived Ray's own 60 s limit for an unreachable GCS. The server's parent is
PID 1 (as under systemd or a container's init), where Ray's driver used to end the process at the first call to
its dead raylet (orchestrator/raylet_fate.py).

The raylet test trains for real (nano model, context 16) in a server subprocess (tests/api/test_recovery.py's
helpers), so it is slow."""

from __future__ import annotations

import os
import signal
import time

import httpx
import psutil
import pytest

from tests.api.conftest import serve
from tests.api.test_recovery import SPEC, attempts, ended, statuses, submit, upscale_serve, wait_for
from upscale.control.tokens import create_token
from upscale.orchestrator.settings import Settings
from upscale.orchestrator.store import Store


def test_healthz_reports_each_loop_and_ray_and_is_503_once_a_loop_is_dead(tmp_path, mlflow_uri,
                                                                          ray_session) -> None:
    settings = Settings(home=tmp_path, mlflow_tracking_uri=mlflow_uri)
    with serve(settings, refit_tick_s=0.1, analysis_tick_s=0.1) as live:
        r = httpx.get(f"{live.url}/healthz")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["status"] == "ok" and body["scheduler"] and body["ray"] is None
        assert set(body["loops"]) == {"upscale-sweeps", "upscale-refits", "upscale-analyses"}
        assert all(loop["ok"] and loop["alive"] for loop in body["loops"].values())
        refits = next(loop for loop in live.app.state.loops if loop.name == "upscale-refits")
        refits.stop()
        refits.join(10)
        r = httpx.get(f"{live.url}/healthz")
        assert r.status_code == 503
        body = r.json()
        assert body["status"] == "unavailable" and body["loops"]["upscale-refits"]["problem"] == "stopped"
        assert body["loops"]["upscale-sweeps"]["ok"]


def ray_processes(server: psutil.Process, names: tuple[str, ...]) -> list[psutil.Process]:
    """The server's embedded Ray processes of those ``names``."""
    found = [p for p in server.children(recursive=True) if p.name() in names]
    assert sorted(p.name() for p in found) == sorted(names), found
    return found


# Ray's driver used to end its process once the GCS had been unreachable for 60 s (a `ray stop` on the host kills
# the GCS and the raylet): the server must outlive that.
GCS_GRACE_S = 65


@pytest.mark.slow  # real training in a server subprocess, and a Ray restart: minutes on 2 busy cores
@pytest.mark.parametrize("killed", [("raylet",), ("raylet", "gcs_server")], ids=["raylet", "raylet-and-gcs"])
def test_a_killed_ray_is_restarted_and_the_sweep_finishes_by_itself(tmp_path, mlflow_uri, killed) -> None:
    settings = Settings(home=tmp_path / "home", mlflow_tracking_uri=mlflow_uri)
    store = Store(settings.db_url)
    token = create_token(store, "write", "alice")
    log = tmp_path / "serve.log"
    with upscale_serve(settings, log, orphan=True) as (url, proc):
        sweep_id = submit(url, token, SPEC)

        def mid_sweep() -> bool:
            seen = list(statuses(store, sweep_id).values())
            return seen.count("done") >= 2 and seen.count("running") >= 1

        wait_for(mid_sweep, 480, "a mid-sweep moment", proc, log)
        done_before = [k for k, s in statuses(store, sweep_id).items() if s == "done"]
        kept = attempts(store, done_before)
        for p in ray_processes(psutil.Process(proc.pid), killed):
            os.kill(p.pid, signal.SIGKILL)
        killed_at = time.monotonic()

        def health() -> httpx.Response:
            return httpx.get(f"{url}/healthz", timeout=10)

        wait_for(lambda: health().status_code == 503, 60, "/healthz to say Ray is down", proc, log)
        down = health().json()
        refused = httpx.post(f"{url}/sweeps", content=SPEC.replace("name: crash", "name: later"), timeout=60,
                             headers={"Authorization": f"Bearer {token}", "content-type": "application/yaml"})
        assert refused.status_code == 503 and "cluster is unavailable" in refused.json()["detail"], refused.text
        wait_for(lambda: ended(store.sweep(sweep_id)), 480, "the sweep to end", proc, log)
        finished = store.sweep(sweep_id)
        assert finished.status == "done", finished.error
        if "gcs_server" in killed:
            time.sleep(max(0.0, killed_at + GCS_GRACE_S - time.monotonic()))
        assert health().status_code == 200
        assert proc.poll() is None  # the server lived through it
    assert down["status"] == "unavailable" and down["ray"] is not None, down
    assert attempts(store, done_before) == kept  # a segment done before the kill was never touched again
    for key, tries in attempts(store, statuses(store, sweep_id)).items():
        states = [t[2] for t in tries]
        assert "failed" not in states, (key, tries)  # Ray's death spent no attempt
        assert states.count("done") + states.count("adopted") == 1, (key, tries)  # finished exactly once
