"""`upscale.client.Client` against a real server (tests/api/conftest.py's uvicorn, no scheduler, so nothing trains):
submit a tiny spec from a file and as a mapping, read it back, list and read its (still empty) observations, cancel
it, and the failures a caller can fix raise ApiError with the status and what to do."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.api.test_flow import FLOW_SPEC
from upscale.client import DEFAULT_TIMEOUT_S, HEAVY_TIMEOUT_S, ApiError, Client
from upscale.orchestrator.observations import JSON_FIELDS
from upscale.orchestrator.settings import Settings


def _token(headers: dict[str, str]) -> str:
    return headers["Authorization"].removeprefix("Bearer ")


def test_submit_read_observe_cancel(live, tmp_path: Path) -> None:
    spec = tmp_path / "flow.yaml"
    spec.write_text(FLOW_SPEC)
    with Client(live.url, _token(live.write)) as api:
        assert api.health() == {"status": "ok", "scheduler": False, "loops": {}, "ray": None}
        created = api.submit(spec)
        assert created["owner"] == "alice" and created["plan"]["segments"] == 18
        detail = api.sweep(created["id"])
        assert detail["name"] == "api-flow" and len(detail["segments"]) == 18
        assert created["id"] in [s["id"] for s in api.sweeps()]
        observations = api.observations(created["id"], kind="upcycled")
        assert observations.empty and {"kind", "N1", "D1", "D2", "loss"} <= set(observations.columns)
        assert api.observations_csv(created["id"]).splitlines()[0].startswith("kind,N,D,N1,D1,D2")
        again = api.submit(yaml.safe_load(FLOW_SPEC))  # a mapping goes as JSON: the same plan
        assert again["plan"] == created["plan"]
        assert api.cancel(created["id"])["status"] == "cancelled"
        assert api.refit_schedules() == [] and api.fits() == []
    assert set(JSON_FIELDS) <= set(observations.columns)


def test_the_token_defaults_to_the_environment(live, monkeypatch) -> None:
    monkeypatch.setenv("UPSCALE_TOKEN", _token(live.read))
    with Client(live.url) as api:
        assert isinstance(api.sweeps(), list)
        with pytest.raises(ApiError, match=r"403.*scope 'write'") as e:
            api.submit({"name": "x"})
    assert e.value.status == 403


def test_errors_say_what_to_do(live) -> None:
    anonymous = Client(live.url, token="")  # token="": no token, whatever UPSCALE_TOKEN holds
    with anonymous, pytest.raises(ApiError, match="pass a token: --token or UPSCALE_TOKEN") as e:
        anonymous.sweeps()
    assert e.value.status == 401
    with Client(live.url, _token(live.write)) as api:
        with pytest.raises(ApiError, match=r"-> 404: no sweep 'nope'") as e:
            api.sweep("nope")
        assert e.value.status == 404
        bad = yaml.safe_load(FLOW_SPEC) | {"model": {"sizes": ["huge"]}}
        with pytest.raises(ApiError, match=r"-> 422: model\.sizes\.0: unknown size 'huge'") as e:
            api.submit(bad)
        assert e.value.status == 422
        with pytest.raises(ApiError, match=r"422: .*law"):
            api.create_fit("no-such-law", "upcycled", rows=[{"N1": 1.0, "loss": 1.0}])
        with pytest.raises(ApiError, match=r"is .* the upscale API"):
            api.request("GET", "/no/such/route")


def test_heavy_requests_wait_longer_unless_upscale_timeout_says(monkeypatch) -> None:
    """A fit or a refit run answers once computed, after waiting up to UPSCALE_HEAVY_WAIT_S for a server thread: the
    client waits HEAVY_TIMEOUT_S for those, its 120 s for the rest; UPSCALE_TIMEOUT (or timeout=) sets both."""
    monkeypatch.delenv("UPSCALE_TIMEOUT", raising=False)
    api = Client("http://127.0.0.1:9")
    assert (api.timeout, api.heavy_timeout) == (DEFAULT_TIMEOUT_S, HEAVY_TIMEOUT_S)
    assert Settings.model_fields["heavy_wait_s"].default + DEFAULT_TIMEOUT_S < HEAVY_TIMEOUT_S
    monkeypatch.setenv("UPSCALE_TIMEOUT", "7")
    assert Client("http://127.0.0.1:9").heavy_timeout == 7
    assert Client("http://127.0.0.1:9", timeout=3).heavy_timeout == 3
