"""Auth and validation against a live server: every failure mode a caller can hit returns the documented status and
a `detail` that names what to fix. No background loops run here, so nothing submitted trains."""

from __future__ import annotations

import pytest
import yaml

from upscale.control.records import TokenRecord
from upscale.control.tokens import digest
from upscale.control.wiring import open_services

SPEC = {"name": "auth-check", "model": {"sizes": ["nano"]}, "moe": {"experts": [2], "topk": [1]},
        "upcycling": {"methods": ["naive"]}, "tokens": {"d1": [256], "d2": [128, 256]},
        "train": {"context": 16, "batch_size": 4, "lr": {"dense": 3e-3, "moe": 2e-3}, "warmup_tokens": 64},
        "resources": {"cpus": 1}}


def test_no_token_is_401_and_read_token_cannot_write(live) -> None:
    with live.client({}) as c:
        r = c.get("/sweeps")
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert c.get("/sweeps", headers={"Authorization": "Bearer ups_nope"}).status_code == 401
        assert c.get("/healthz").json() == {"status": "ok", "scheduler": False, "loops": {}, "ray": None}
    with live.client(live.read) as c:
        assert c.get("/sweeps").status_code == 200
        r = c.post("/sweeps", json=SPEC)
        assert r.status_code == 403 and "bob" in r.json()["detail"] and "write" in r.json()["detail"]
        assert c.post("/fits", json={"law": "power-d2", "kind": "upcycled", "rows": []}).status_code == 403
    with open_services(live.settings).store.transaction() as s:  # only hashes are stored
        hashes = {t.token_hash for t in s.query(TokenRecord)}
    assert digest(live.write["Authorization"].split()[1]) in hashes
    assert not any(t.startswith("ups_") for t in hashes)


def test_bad_spec_is_422_naming_each_field(live) -> None:
    bad = {**SPEC, "tokens": {"d1": ["lots"], "d2": [128]}, "moe": {"experts": [2], "topk": [3]}}
    with live.client() as c:
        r = c.post("/sweeps", json=bad)
        assert r.status_code == 422
        locs = [d["loc"] for d in r.json()["detail"]]
        assert ["body", "tokens", "d1", 0] in locs
        # one expert is no MoE: refused at the field, not planned as MoE segments a worker would build dense
        r = c.post("/sweeps", json={**SPEC, "moe": {"experts": [2, 1], "topk": [1]}})
        (problem,) = r.json()["detail"]
        assert r.status_code == 422 and problem["loc"] == ["body", "moe", "experts", 1], r.text
        assert "at least 2 experts" in problem["msg"]
        r = c.post("/sweeps", content="name: [unclosed", headers={"content-type": "application/yaml"})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body"]
        assert c.get("/sweeps/nope").status_code == 404
        r = c.post("/fits", json={"law": "no-such-law", "kind": "upcycled", "rows": [{"D2": 1, "loss": 1}]})
        assert r.status_code == 422 and "no-such-law" in r.json()["detail"][0]["msg"]
        assert r.json()["detail"][0]["loc"] == ["body", "law"]


def test_an_unknown_sweep_is_404_on_every_route_and_422_in_a_fit_body(live) -> None:
    """One exception handler maps the store's NotFoundError to 404 with the message as `detail`; a sweep id inside a
    request body is a bad value (422), not a missing URL."""
    gone = {"detail": "no sweep 'f00000000000'; `upscale status` (GET /sweeps) lists them"}
    schedule = {"name": "x", "trigger": "on_new_observations",
                "request": {"sweep_ids": ["f00000000000"]}}
    with live.client() as c:
        assert c.get("/sweeps/nope").json() == {"detail": "no sweep 'nope'; GET /sweeps lists them"}  # not an id
        for method, url, body in (("POST", "/sweeps/f00000000000/cancel", None),
                                  ("POST", "/sweeps/f00000000000/extend", {"additions": {}}),
                                  ("GET", "/sweeps/f00000000000/observations", None),
                                  ("POST", "/refit-schedules", schedule)):
            r = c.request(method, url, json=body)
            assert (r.status_code, r.json()) == (404, gone), url
        r = c.post("/fits", json={"law": "joint", "kind": "upcycled", "sweep_ids": ["f00000000000"]})
        (problem,) = r.json()["detail"]
        assert (r.status_code, problem["loc"], problem["msg"]) == (422, ["body", "sweep_ids"], gone["detail"])
        for path in ("/sweeps/{sweep_id}", "/sweeps/{sweep_id}/cancel", "/sweeps/{sweep_id}/observations"):
            assert "404" in next(iter(c.get("/openapi.json").json()["paths"][path].values()))["responses"]


def test_yaml_submit_records_owner_and_plan(live) -> None:
    with live.client() as c:
        r = c.post("/sweeps", content=yaml.safe_dump(SPEC), headers={"content-type": "application/yaml"})
        assert r.status_code == 201, r.text
        body = r.json()
        assert body["owner"] == "alice" and body["status"] == "pending"
        # dense trunk and decay, upcycle, the MoE trunk as two pieces (cut at each D2's decay start), 2 decays
        assert body["plan"]["segments"] == 7 == body["plan"]["new_segments"]
        assert body["plan"]["by_kind"]["moe_decay"]["count"] == 2 and body["plan"]["observations"] == 3
        # the summary `upscale plan` prints: a time estimate, and what the one-size, one-D1 grid cannot identify
        estimate = body["plan"]["estimate"]
        assert 0 < estimate["critical_path_s"] <= estimate["serial_s"] == pytest.approx(
            sum(k["seconds"] for k in body["plan"]["by_kind"].values()))
        unidentified = {c["law"]: c["add"] for c in body["plan"]["identifiability"] if not c["identifiable"]}
        assert "more dense size" in unidentified["joint"] and "tokens.d1" in unidentified["data-mul"]
        detail = c.get(f"/sweeps/{body['id']}").json()
        assert detail["owner"] == "alice" and detail["segments_total"] == 7 and detail["flops_done"] == 0
        assert detail["flops_planned"] == sum(s["flops"] for s in detail["segments"]) > 0
        ext = c.post(f"/sweeps/{body['id']}/extend", json={"additions": {"tokens": {"d2": [384]}}}).json()
        assert ext["plan"]["segments"] == 9 and ext["plan"]["new_segments"] == 9  # nothing trained yet
        assert c.post(f"/sweeps/{body['id']}/cancel").json()["status"] == "cancelled"
        metrics = c.get("/metrics", headers={}).text
        # the extension appends a piece to the MoE trunk and its decay (D2=384): 7 + 2 segments
        assert 'upscale_segments{state="pending"} 9.0' in metrics and "upscale_queue_length 1.0" in metrics
