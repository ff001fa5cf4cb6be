"""Per-token quotas on a live server: a token with UPSCALE_MAX_SWEEPS_IN_FLIGHT sweeps pending is refused a new one
(submit or extend) with 429 and Retry-After, nothing stored, while another token is not; cancelling one frees a
place. Fits and analyses past their per-minute limits are 429 before any work. No background loops: nothing trains,
so submitted sweeps stay pending."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.api.conftest import Live, serve
from tests.api.test_limits import SPEC
from upscale.api.auth import create_token
from upscale.orchestrator.settings import Settings


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
