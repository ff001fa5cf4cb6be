"""Ids and NUL characters are refused at the edge, on SQLite and on a real PostgreSQL server: every path id that is not
12 hex digits is a 404 saying what lists the real ones, a NUL in a path is a 404 and in a query or a body (JSON's
`\\u0000`, YAML's `\\0`) a 422, and none of them is a 5xx; PostgreSQL, which refuses NUL in a text parameter with an
error, never sees one. No background loops: nothing trains."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.api.conftest import Live, serve
from upscale.orchestrator.settings import Settings

METHODS = {"get", "post", "delete"}
BODIES: dict[str, Any] = {"/sweeps/{sweep_id}/extend": {"additions": {}}, "/sweeps/{sweep_id}/suggest":
                          {"budget_flops": 1e15}, "/sweeps/{sweep_id}/analysis": {}}


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def server(request, tmp_path, mlflow_uri) -> Iterator[Live]:
    db = {} if request.param == "sqlite" else {"db_url": request.getfixturevalue("postgres_url")}
    with serve(Settings(home=tmp_path, mlflow_tracking_uri=mlflow_uri, **db), scheduler=False) as live:
        yield live


def _id_routes(live: Live) -> list[tuple[str, str, list[str]]]:
    """(method, path template, its path parameters) of every operation with an id among its path parameters (a
    segment's content key is checked by its own pattern: tests/api/test_invalidate.py)."""
    schema = httpx.get(f"{live.url}/openapi.json", timeout=30).json()
    routes = [(method, path, [p["name"] for p in op.get("parameters", []) if p["in"] == "path"])
              for path, item in schema["paths"].items() for method, op in item.items() if method in METHODS]
    return [r for r in routes if any(p.endswith("_id") for p in r[2])]


def test_ids_that_no_row_can_have_are_404_on_every_route(server) -> None:
    routes = _id_routes(server)
    assert len(routes) >= 14
    with server.client() as c:
        for bad in ("nope", "ab%00cd", "%00", "ABCDEF012345", "0123456789abc"):
            for method, path, params in routes:
                url = path
                for p in params:
                    url = url.replace(f"{{{p}}}", bad if p.endswith("_id") else "parity")
                r = c.request(method, url.replace("{name}", "parity").replace("{name:path}", "parity.png"),
                              json=BODIES.get(path))
                assert r.status_code == 404, (method, url, r.status_code, r.text)
                if "%00" not in bad:
                    assert "lists them" in r.json()["detail"], (url, r.text)


def test_a_nul_in_a_query_or_a_body_is_422_and_stores_nothing(server) -> None:
    with server.client() as c:
        for url in ("/decisions/upcycle?n1=1e8&d1=1e9&d2=1e9&sweep_id=%00",
                    "/decisions/upcycle?n1=1e8&d1=1e9&d2=1e9&group=a%00b", "/analyses?status=%00",
                    "/sweeps/0123456789ab/analysis/plots/x.png?analysis_id=%00"):
            r = c.get(url)
            assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query"], (url, r.text)
        posts = [("/fits", {"law": "joint", "kind": "upcycled", "sweep_ids": ["\0"]}),
                 ("/fits", {"law": "joint\0", "kind": "upcycled", "rows": [{"D2": 1, "loss": 1}]}),
                 ("/refit-schedules", {"name": "n\0", "trigger": "on_new_observations",
                                       "request": {"sweep_ids": ["0123456789ab"]}}),
                 ("/sweeps", {"name": "x", "description": "\0"}), ("/sweeps", {"name\0": "x"})]
        for url, body in posts:
            r = c.post(url, content=json.dumps(body), headers={"content-type": "application/json"})
            assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body"], (url, r.text)
        # an escaped backslash before "u0000" is text, not a NUL: the body reaches the route (an unknown law)
        r = c.post("/fits", content=json.dumps({"law": "\\u0000", "kind": "upcycled", "rows": [{"D2": 1, "loss": 1}]}),
                   headers={"content-type": "application/json"})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "law"], r.text
        r = c.post("/sweeps", content='name: x\ndescription: "a\\0b"\n', headers={"content-type": "application/yaml"})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "description"], r.text
        assert "NUL" in r.json()["detail"][0]["msg"]
        assert c.get("/sweeps").json() == [] and c.get("/fits").json() == [] and c.get("/refit-schedules").json() == []
