"""Token lifetimes on live servers: `upscale token revoke` (the console script, on the store's file) is refused by the
very next request to both of two servers sharing the store; a token past its `expires_at` is refused; `upscale token
list` shows names, ids, scopes and states and never a token; the REST client says what a 401 means."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from tests.api.conftest import serve
from upscale.client import ApiError, Client
from upscale.control.tokens import create_token, digest, tokens
from upscale.orchestrator.clock import as_utc, utcnow
from upscale.orchestrator.settings import Settings

UPSCALE = str(Path(sys.executable).parent / "upscale")


def _cli(settings: Settings, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "UPSCALE_HOME": str(settings.home), "MLFLOW_TRACKING_URI": settings.mlflow_tracking_uri}
    r = subprocess.run([UPSCALE, "token", *args], env=env, capture_output=True, text=True, timeout=120)
    assert (r.returncode == 0) == ok, r.stdout + r.stderr
    return r


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def settings(tmp_path, mlflow_uri) -> Settings:
    return Settings(home=tmp_path, mlflow_tracking_uri=mlflow_uri)


@pytest.mark.slow  # ~16 s on 2 cores: three real servers
def test_a_revoked_token_is_refused_at_once_by_every_server_on_the_store(settings) -> None:
    with serve(settings, scheduler=False) as one, serve(settings, scheduler=False) as two:
        store = one.app.state.services.store
        dave = [create_token(store, "write", "dave") for _ in range(2)]
        erin = create_token(store, "read", "erin")
        for live in (one, two):  # each server has answered (and, before, would have cached) every token
            for token in (*dave, erin):
                assert live.client(_bearer(token)).get("/sweeps").status_code == 200
        first_id = next(t.id for t in tokens(store) if t.token_hash == digest(dave[0]))
        _cli(settings, "revoke", first_id)  # one token by id
        statuses = {(live.url, token): live.client(_bearer(token)).get("/sweeps").status_code
                    for live in (one, two) for token in dave}
        assert statuses == {(one.url, dave[0]): 401, (two.url, dave[0]): 401,
                            (one.url, dave[1]): 200, (two.url, dave[1]): 200}
        assert "revoked 1 token" in _cli(settings, "revoke", "dave").stderr  # every remaining token of the name
        for live in (one, two):
            r = live.client(_bearer(dave[1])).get("/sweeps")
            assert r.status_code == 401 and "revoked" in r.json()["detail"]
            assert live.client(_bearer(erin)).get("/sweeps").status_code == 200  # other names are untouched
        again = _cli(settings, "revoke", "dave", ok=False)
        assert again.returncode == 2 and again.stderr.startswith("error: no active token with id or name 'dave'")


def test_an_expired_token_is_refused_and_a_live_one_is_not(settings) -> None:
    with serve(settings, scheduler=False) as live:
        store = live.app.state.services.store
        past = create_token(store, "write", "frank", expires_at=utcnow() - timedelta(seconds=1))
        future = create_token(store, "write", "frank", expires_at=utcnow() + timedelta(hours=1))
        assert live.client(_bearer(past)).get("/sweeps").status_code == 401
        assert live.client(_bearer(future)).post("/sweeps/nope/cancel").status_code == 404  # past auth: no sweep
        with Client(live.url, past) as client, pytest.raises(ApiError, match="revoked or has expired"):
            client.sweeps()


def test_token_create_expires_and_list(settings) -> None:
    token = _cli(settings, "create", "--scope", "admin", "root", "--expires", "30").stdout.strip()
    assert token.startswith("ups_")
    with serve(settings, scheduler=False) as live:
        assert live.client(_bearer(token)).get("/sweeps").status_code == 200
        store = live.app.state.services.store
        (record,) = [t for t in tokens(store) if t.name == "root"]
        assert record.scope == "admin"
        assert timedelta(days=29) < as_utc(record.expires_at) - utcnow() <= timedelta(days=30)
        create_token(store, "read", "gone", expires_at=utcnow() - timedelta(days=1))
    listing = _cli(settings, "list").stdout
    rows = {line.split()[1]: line for line in listing.splitlines() if "│" in line}
    assert record.id in rows["root"] and "admin" in rows["root"] and "active" in rows["root"]
    assert "expired" in rows["gone"]
    assert "alice" in rows and "bob" in rows  # the tokens serve() made
    assert token not in listing and "ups_" not in listing and record.token_hash not in listing
    bad = _cli(settings, "create", "--scope", "owner", ok=False)
    assert bad.returncode == 2 and "use read, write, admin" in bad.stderr


def test_an_admin_token_lists_and_revokes_tokens_over_rest(settings) -> None:
    with serve(settings, scheduler=False) as live:
        store = live.app.state.services.store
        root = _bearer(create_token(store, "admin", "root"))
        victim = create_token(store, "write", "gina", expires_at=utcnow() + timedelta(days=1))
        assert live.client(live.write).get("/tokens").status_code == 403  # alice: write is not admin
        listed = live.client(root).get("/tokens")
        assert listed.status_code == 200 and victim not in listed.text and digest(victim) not in listed.text
        (gina,) = [t for t in listed.json() if t["name"] == "gina"]
        assert gina["state"] == "active" and gina["expires_at"].endswith("Z") and gina["scope"] == "write"
        r = live.client(root).delete(f"/tokens/{gina['id']}")
        assert r.status_code == 200 and r.json()["state"] == "revoked"
        assert live.client(_bearer(victim)).get("/sweeps").status_code == 401
        assert live.client(root).delete("/tokens/gina").status_code == 404  # an id, never a name, over REST


def test_revocation_refuses_the_name_at_once_and_keeps_its_work_until_an_admin_stops_it(settings) -> None:
    """What revocation means (README, Token lifetimes): a credential withdrawn, not work cancelled. Work belongs to a
    name, not to one of its tokens (rotating a token must not cancel it), so the revoked name's queued sweep and its
    cron schedule stay as they were; an admin token stops them on purpose."""
    from tests.api.test_limits import SPEC

    with serve(settings, scheduler=False) as live:
        store = live.app.state.services.store
        root = live.client(_bearer(create_token(store, "admin", "root")))
        hal = live.client(_bearer(create_token(store, "write", "hal")))
        sweep = hal.post("/sweeps", json={**SPEC, "name": "hal-sweep"})
        assert sweep.status_code == 201, sweep.text
        schedule = hal.post("/refit-schedules", json={"name": "nightly", "trigger": "cron", "cron": "0 3 * * *",
                                                      "request": {"sweep_ids": [sweep.json()["id"]]}})
        assert schedule.status_code == 201, schedule.text
        for token in [t for t in tokens(store) if t.name == "hal"]:
            assert root.delete(f"/tokens/{token.id}").status_code == 200
        assert hal.get("/sweeps").status_code == 401
        assert root.get(f"/sweeps/{sweep.json()['id']}").json()["status"] == "pending"  # still queued to train
        assert schedule.json()["id"] in {s["id"] for s in root.get("/refit-schedules").json()}  # still firing
        assert root.post(f"/sweeps/{sweep.json()['id']}/cancel").status_code == 200
        assert root.delete(f"/refit-schedules/{schedule.json()['id']}").status_code == 204
