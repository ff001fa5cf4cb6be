"""Ownership on a live server: alice (write), carol (write), bob (read) and root (admin) against every mutating route
of the app, acting on alice's sweep, analysis and refit schedule. The table of cells is checked against the app's
routes, so a new mutating route fails here until it is given a rule (and, if it changes what someone owns, a check).

Rules: `own` routes change an existing resource: its owner and admin tokens may, other write tokens get 403 naming
the owner rule; `create` routes make something the caller owns (reading anyone's sweeps): any write token may;
`admin` routes (revoking a token, invalidating a segment) need an admin token. Read tokens see everything and change
nothing. Also here: every timestamp the API returns has one timezone-aware form.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.api.conftest import Live, serve
from tests.api.test_analysis import GRID, fill, wait_done
from upscale.control.services import Services
from upscale.control.sweeps import submit
from upscale.control.tokens import create_token, tokens
from upscale.orchestrator.settings import Settings
from upscale.sweeps.spec import parse_spec

SCOPES = {"alice": "write", "carol": "write", "bob": "read", "root": "admin"}
PENDING = {"name": "ownership", "model": {"sizes": ["nano"]}, "moe": {"experts": [2], "topk": [1]},
           "upcycling": {"methods": ["naive"]}, "tokens": {"d1": [256], "d2": [128]},
           "train": {"context": 16, "batch_size": 4, "lr": {"dense": 3e-3, "moe": 2e-3}, "warmup_tokens": 64},
           "resources": {"cpus": 1}}
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


@dataclass
class World:
    live: Live
    services: Services
    headers: dict[str, dict[str, str]]  # who -> Authorization header
    sweep: str  # alice's sweep with observations (from fill)
    schedule: str  # alice's refit schedule on it

    def alice_pending_sweep(self) -> str:
        return submit(self.services, parse_spec(PENDING), "alice", new=True).id

    def alice_token(self) -> str:
        create_token(self.services.store, "write", "alice")
        return tokens(self.services.store)[-1].id

    def alice_schedule(self) -> str:
        with self.live.client(self.headers["alice"]) as c:
            r = c.post("/refit-schedules", json=_schedule_body(self.sweep))
        assert r.status_code == 201, r.text
        return r.json()["id"]


def _schedule_body(sweep_id: str) -> dict[str, Any]:
    return {"name": "nightly", "trigger": "on_new_observations", "request": {"sweep_ids": [sweep_id], "bootstrap": 0}}


@dataclass
class Cell:
    """How to call one mutating route as someone, against alice's resources, and who may."""

    rule: str  # own: the owner and admin tokens; create: any write token; admin: admin tokens only
    call: Callable[[World], tuple[str, dict[str, Any] | None]]  # -> (url, json body)
    after: Callable[[World, str, httpx.Response], None] | None = None  # what an allowed call did (caller, answer)
    through: int | None = None  # a status past the scope check that an allowed call may get here (not 2xx)


def _owned_by_caller(world: World, who: str, r: httpx.Response) -> None:
    assert r.json()["owner"] == who


def _still_pending(world: World, url: str) -> None:
    with world.live.client(world.headers["bob"]) as c:
        assert c.get(url.removesuffix("/cancel")).json()["status"] == "pending"


CELLS: dict[tuple[str, str], Cell] = {
    ("POST", "/sweeps"): Cell("create", lambda w: ("/sweeps?new=true", PENDING), _owned_by_caller),
    ("POST", "/sweeps/{sweep_id}/cancel"): Cell(
        "own", lambda w: (f"/sweeps/{w.alice_pending_sweep()}/cancel", None),
        lambda w, who, r: (r.json()["status"] == "cancelled") or pytest.fail(r.text)),
    ("POST", "/sweeps/{sweep_id}/extend"): Cell(
        "create", lambda w: (f"/sweeps/{w.sweep}/extend", {"additions": {"tokens": {"d2": [4096]}}}),
        _owned_by_caller),
    # applying a suggestion creates the caller's sweep, as extend; alice's tiny sweep may have no analysis or no D*
    # crossing, so an allowed caller may get past the scope check to the 409 saying so (tests/api/test_suggest.py
    # applies one)
    ("POST", "/sweeps/{sweep_id}/suggest"): Cell(
        "create", lambda w: (f"/sweeps/{w.sweep}/suggest", {"budget_flops": 1e15, "apply": True}), through=409),
    # the first allowed caller starts it (202, running), later ones find it done (200) or still running (409)
    ("POST", "/sweeps/{sweep_id}/analysis"): Cell(
        "own", lambda w: (f"/sweeps/{w.sweep}/analysis", {"bootstrap": 0}),
        lambda w, who, r: (r.json()["status"] in ("running", "done")) or pytest.fail(r.text), through=409),
    ("POST", "/fits"): Cell("create", lambda w: ("/fits", {"law": "chinchilla", "kind": "dense",
                                                           "sweep_ids": [w.sweep]}), _owned_by_caller),
    ("POST", "/refit-schedules"): Cell("create", lambda w: ("/refit-schedules", _schedule_body(w.sweep)),
                                       _owned_by_caller),
    ("DELETE", "/refit-schedules/{schedule_id}"): Cell(
        "own", lambda w: (f"/refit-schedules/{w.alice_schedule()}", None)),
    ("POST", "/refit-schedules/{schedule_id}/run"): Cell(
        "own", lambda w: (f"/refit-schedules/{w.schedule}/run", None),
        lambda w, who, r: (r.json()["schedule_id"] == w.schedule) or pytest.fail(r.text)),
    # segments are shared by every sweep that needs them: only an admin retrains one (tests/api/test_invalidate.py
    # invalidates a real one); an unknown key gets past the scope check to 404
    ("POST", "/segments/{key}/invalidate"): Cell("admin", lambda w: (f"/segments/{'0' * 16}/invalidate", None),
                                                 through=404),
    ("DELETE", "/tokens/{token_id}"): Cell(
        "admin", lambda w: (f"/tokens/{w.alice_token()}", None),
        lambda w, who, r: (r.json()["state"] == "revoked") or pytest.fail(r.text)),
}


@pytest.fixture(scope="module")
def world(tmp_path_factory, mlflow_uri) -> Iterator[World]:
    settings = Settings(home=tmp_path_factory.mktemp("home"), mlflow_tracking_uri=mlflow_uri)
    with serve(settings, scheduler=False) as live:
        services = live.app.state.services
        headers = {who: {"Authorization": f"Bearer {create_token(services.store, scope, who)}"}  # type: ignore
                   for who, scope in SCOPES.items()}
        sweep = fill(services, grid=GRID)
        w = World(live, services, headers, sweep, schedule="")
        w.schedule = w.alice_schedule()
        yield w


def test_the_table_covers_every_mutating_route(world) -> None:
    paths = world.live.app.openapi()["paths"]  # every route the app serves (included routers too)
    routes = {(method.upper(), path) for path, ops in paths.items() for method in ops if method != "get"}
    assert routes == set(CELLS), "give each new mutating route a cell (and an ownership check if it changes " \
                                 "something someone owns)"


@pytest.mark.parametrize("route", sorted(CELLS), ids=lambda r: f"{r[0]} {r[1]}")
@pytest.mark.parametrize("who", list(SCOPES))
def test_cross_user_matrix(world, route, who) -> None:
    cell = CELLS[route]
    url, body = cell.call(world)
    allowed = SCOPES[who] == "admin" or (SCOPES[who] == "write" and (cell.rule == "create"
                                                                      or (cell.rule == "own" and who == "alice")))
    with world.live.client(world.headers[who]) as c:
        r = c.request(route[0], url, json=body)
    if not allowed:
        assert r.status_code == 403, r.text
        expected = f"has scope '{SCOPES[who]}'" if SCOPES[who] == "read" or cell.rule == "admin" else \
            "belongs to 'alice'"
        assert expected in r.json()["detail"]
        if route == ("POST", "/sweeps/{sweep_id}/cancel"):
            _still_pending(world, url)
        return
    assert 200 <= r.status_code < 300 or r.status_code == cell.through, r.text
    if cell.after is not None and r.status_code < 300:
        cell.after(world, who, r)


def test_without_a_token_every_mutating_route_is_401(world) -> None:
    with world.live.client({}) as c:
        for (method, _), cell in CELLS.items():
            url, body = cell.call(world)
            assert c.request(method, url, json=body).status_code == 401, url


def test_a_read_token_sees_every_owners_sweeps_fits_and_schedules(world) -> None:
    with world.live.client(world.headers["bob"]) as c:
        owners = {s["owner"] for s in c.get("/sweeps").json()}
        assert "alice" in owners
        assert c.get(f"/sweeps/{world.sweep}").json()["owner"] == "alice"
        assert any(s["id"] == world.schedule for s in c.get("/refit-schedules").json())
    with world.live.client(world.headers["carol"]) as c:
        assert c.get(f"/sweeps/{world.sweep}/observations").status_code == 200


def test_every_timestamp_is_timezone_aware_utc_in_one_form(world) -> None:
    """POST /fits answered `...Z` and GET without it, as SQLite gives timestamps back naive: now one form."""
    with world.live.client(world.headers["alice"]) as c:
        created = c.post("/fits", json={"law": "chinchilla", "kind": "dense", "sweep_ids": [world.sweep]}).json()
        fetched = c.get(f"/fits/{created['id']}").json()
        assert created["created_at"] == fetched["created_at"]
        stamps = [created["created_at"], *(f["created_at"] for f in c.get("/fits").json()),
                  *(s["created_at"] for s in c.get("/sweeps").json()),
                  c.get(f"/sweeps/{world.sweep}").json()["created_at"],
                  *(s["created_at"] for s in c.get("/refit-schedules").json())]
        started = c.post(f"/sweeps/{world.sweep}/analysis", json={"bootstrap": 0, "seed": 7}).json()
        analysis = wait_done(c, started["id"])
        stamps += [analysis["created_at"], analysis["finished_at"]]
        stamps += [a[k] for a in c.get("/analyses").json() for k in ("created_at", "finished_at") if a[k]]
    assert all(ISO_UTC.match(s) for s in stamps), [s for s in stamps if not ISO_UTC.match(s)]
