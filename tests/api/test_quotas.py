"""Per-token quotas on a live server: a token with UPSCALE_MAX_SWEEPS_IN_FLIGHT sweeps pending is refused a new one
(submit or extend) with 429 and Retry-After, nothing stored, while another token is not; cancelling one frees a
place. Submissions racing each other cannot pass the quota, nor can re-queueing a cancelled sweep, and on a
PostgreSQL store two servers share it. Fits and analyses past their per-minute limits are 429 before any work. No
background loops: nothing trains, so submitted sweeps stay pending."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.api.conftest import Live, serve
from tests.api.test_limits import SPEC
from upscale.control import sweeps
from upscale.control.tokens import create_token
from upscale.control.wiring import open_services
from upscale.orchestrator.settings import Settings
from upscale.sweeps.spec import parse_spec


@pytest.fixture(scope="module")
def server(tmp_path_factory, mlflow_uri) -> Iterator[Live]:
    settings = Settings(home=tmp_path_factory.mktemp("home"), mlflow_tracking_uri=mlflow_uri, max_sweeps_in_flight=2,
                        max_fits_per_minute=2, max_analyses_per_minute=1)
    with serve(settings, scheduler=False) as live:
        yield live


def _token(live: Live, name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {create_token(live.app.state.services.store, 'write', name)}"}


def test_sweeps_in_flight_past_the_quota_are_429_until_one_ends(server) -> None:
    with server.client() as c:
        first, _ = (c.post("/sweeps", json={**SPEC, "name": f"q{i}"}).json() for i in range(2))
        r = c.post("/sweeps", json={**SPEC, "name": "q2"})
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1, r.text
        assert "UPSCALE_MAX_SWEEPS_IN_FLIGHT=2" in r.json()["detail"]
        r = c.post(f"/sweeps/{first['id']}/extend", json={"additions": {"tokens": {"d2": [512]}}})
        assert r.status_code == 429, r.text
        assert sorted(s["name"] for s in c.get("/sweeps").json()) == ["q0", "q1"]
    with server.client(_token(server, "carol")) as other:
        assert other.post("/sweeps", json={**SPEC, "name": "q2"}).status_code == 201  # her own quota
    with server.client() as c:
        assert c.post(f"/sweeps/{first['id']}/cancel").json()["status"] == "cancelled"
        assert c.post("/sweeps", json={**SPEC, "name": "q3"}).status_code == 201


def test_fits_and_analyses_past_their_rate_are_429_before_any_work(server) -> None:
    headers = _token(server, "dave")
    body = {"law": "joint", "kind": "upcycled", "rows": [{"N1": 1e8, "D1": 1e9, "D2": 1e9, "loss": 3.0}]}
    with server.client(headers) as c:
        assert [c.post("/fits", json=body).status_code for _ in range(2)] == [422, 422]  # too few points: tried
        r = c.post("/fits", json=body)
        assert r.status_code == 429 and 1 <= int(r.headers["retry-after"]) <= 60, r.text
        assert "UPSCALE_MAX_FITS_PER_MINUTE=2" in r.json()["detail"]
        sweep = c.post("/sweeps", json={**SPEC, "name": "dave"}).json()["id"]
        assert c.post(f"/sweeps/{sweep}/analysis", json={}).status_code == 409  # nothing finished yet
        r = c.post(f"/sweeps/{sweep}/analysis", json={})
        assert r.status_code == 429 and "UPSCALE_MAX_ANALYSES_PER_MINUTE=1" in r.json()["detail"], r.text
    with server.client(_token(server, "erin")) as c:
        assert c.post("/fits", json=body).status_code == 422  # another token's minute is its own


def test_racing_submissions_and_a_requeue_cannot_pass_the_in_flight_quota(server) -> None:
    headers = _token(server, "racer")

    def submit(i: int) -> int:
        with server.client(headers) as c:
            return c.post("/sweeps", json={**SPEC, "name": f"race-{i}"}).status_code

    with ThreadPoolExecutor(20) as pool:
        statuses = Counter(pool.map(submit, range(20)))
    assert statuses == {201: 2, 429: 18}, statuses  # at the quota of 2, whatever the order
    with server.client(headers) as c:
        mine = [s for s in c.get("/sweeps").json() if s["owner"] == "racer"]
        assert len(mine) == 2
        cancelled = mine[0]
        assert c.post(f"/sweeps/{cancelled['id']}/cancel").json()["status"] == "cancelled"
        assert c.post("/sweeps", json={**SPEC, "name": "race-next"}).status_code == 201  # the freed place
        again = c.post("/sweeps", json={**SPEC, "name": cancelled["name"]})  # identical: would queue it again
        assert again.status_code == 429 and "UPSCALE_MAX_SWEEPS_IN_FLIGHT=2" in again.json()["detail"], again.text
        assert c.get(f"/sweeps/{cancelled['id']}").json()["status"] == "cancelled"


@pytest.mark.postgres
def test_two_servers_on_one_postgresql_store_share_the_in_flight_quota(tmp_path, mlflow_uri, postgres_url) -> None:
    settings = Settings(home=tmp_path, mlflow_tracking_uri=mlflow_uri, db_url=postgres_url, max_sweeps_in_flight=3)
    servers = [open_services(settings), open_services(settings)]  # two processes' worth: engines, pools, caches

    def submit(i: int) -> str:
        try:
            sweeps.submit(servers[i % 2], parse_spec({**SPEC, "name": f"pg-{i}"}), "racer")
            return "created"
        except sweeps.TooManyInFlight:
            return "refused"

    with ThreadPoolExecutor(20) as pool:
        outcomes = Counter(pool.map(submit, range(20)))
    assert outcomes == {"created": 3, "refused": 17}, outcomes
    assert len(servers[0].store.sweeps()) == 3
