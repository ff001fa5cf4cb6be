"""Heavy requests never hold the threads every other request is answered on: on a live server whose heavy-request
threads (one) and queue (one) are taken, a fit, a submission and a refit run are refused with 429 and a
Retry-After, nothing done, while /healthz and GET /sweeps answer; a request that waited for a thread longer than
UPSCALE_HEAVY_WAIT_S is refused without being computed. The threads are held by calls the test releases (what
they run does not matter: any heavy request takes its place the same way). No background loops."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.api.conftest import Live, serve
from tests.api.test_limits import SPEC
from upscale.orchestrator.settings import Settings

FIT = {"law": "joint", "kind": "upcycled", "rows": [{"N1": 1e8, "D1": 1e9, "D2": 1e9, "loss": 3.0}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory, mlflow_uri) -> Iterator[Live]:
    settings = Settings(home=tmp_path_factory.mktemp("home"), mlflow_tracking_uri=mlflow_uri, heavy_workers=1,
                        heavy_queue=1, heavy_wait_s=0.5)
    with serve(settings, scheduler=False) as live:
        yield live


def hold(live: Live, places: int) -> tuple[threading.Event, list[threading.Thread]]:
    """Take ``places`` of the server's heavy threads and queue until the event is set."""
    release, pool = threading.Event(), live.app.state.heavy
    threads = [threading.Thread(target=asyncio.run, args=(pool.run(release.wait),)) for _ in range(places)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while pool.admitted < places:
        assert time.monotonic() < deadline, "the held calls were not admitted"
        time.sleep(0.01)
    return release, threads


def test_a_full_heavy_queue_is_429_while_health_and_reads_answer(server) -> None:
    with server.client() as c:
        schedule = {"name": "s", "trigger": "on_new_observations",
                    "request": {"sweep_ids": [c.post("/sweeps", json=SPEC).json()["id"]]}}
        schedule_id = c.post("/refit-schedules", json=schedule).json()["id"]
    release, threads = hold(server, 2)
    try:
        with server.client() as c:
            refused = [c.post("/fits", json=FIT), c.post("/sweeps", json={**SPEC, "name": "other"}),
                       c.post(f"/refit-schedules/{schedule_id}/run")]
            for r in refused:
                assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1, r.text
                assert "UPSCALE_HEAVY_QUEUE" in r.json()["detail"]
            assert c.get("/healthz").status_code == 200
            assert [s["name"] for s in c.get("/sweeps").json()] == ["limits"]  # nothing of the refused stored
            assert c.get("/fits").json() == []
    finally:
        release.set()
        for t in threads:
            t.join(30)
    with server.client() as c:
        assert c.post("/fits", json=FIT).status_code == 422  # computed now: too few points


def test_a_request_that_waited_past_the_heavy_wait_is_refused_undone(server) -> None:
    release, threads = hold(server, 1)
    answers: list[httpx.Response] = []
    with server.client() as c:
        waiting = threading.Thread(target=lambda: answers.append(c.post("/sweeps", json={**SPEC, "name": "late"})))
        waiting.start()
        while server.app.state.heavy.admitted < 2:
            time.sleep(0.01)
        time.sleep(2 * server.settings.heavy_wait_s)  # it waits past UPSCALE_HEAVY_WAIT_S
        release.set()
        waiting.join(60)
        for t in threads:
            t.join(30)
        (r,) = answers
        assert r.status_code == 429 and "UPSCALE_HEAVY_WAIT_S=0.5" in r.json()["detail"], r.text
        assert "late" not in [s["name"] for s in c.get("/sweeps").json()]
