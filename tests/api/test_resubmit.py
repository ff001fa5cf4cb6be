"""Re-submitting an identical spec returns the caller's existing sweep (200, `existing`) instead of recording a new
one; `new=true` forces one; another owner's sweeps never match; a cancelled sweep is queued again. On a live server
without background loops (nothing trains), and in the store: rows from before the spec hash are never matched."""

from __future__ import annotations

import yaml

from tests.api.test_auth_validation import SPEC
from upscale.control.tokens import create_token
from upscale.control.wiring import open_services
from upscale.orchestrator.service import spec_hash
from upscale.sweeps.planner import plan
from upscale.sweeps.spec import parse_spec

RESUBMIT = {**SPEC, "name": "resubmit"}


def test_identical_spec_returns_the_owners_sweep_unless_new(live) -> None:
    store = open_services(live.settings).store
    dave = {"Authorization": f"Bearer {create_token(store, 'write', 'dave')}"}
    with live.client() as c:
        first = c.post("/sweeps", json=RESUBMIT)
        assert first.status_code == 201 and first.json()["existing"] is False
        sid = first.json()["id"]
        # the same spec, as YAML with keys reordered and a float written as an int: the same validated spec
        same = yaml.safe_dump({**RESUBMIT, "train": {**RESUBMIT["train"], "warmup_tokens": 64.0}}, sort_keys=True)
        again = c.post("/sweeps", content=same, headers={"content-type": "application/yaml"})
        assert again.status_code == 200 and again.json()["existing"] is True and again.json()["id"] == sid
        assert again.json()["plan"]["segments"] == first.json()["plan"]["segments"]
        forced = c.post("/sweeps", json=RESUBMIT, params={"new": "true"})
        assert forced.status_code == 201 and forced.json()["id"] != sid and not forced.json()["existing"]
        assert c.post("/sweeps", json=RESUBMIT).json()["id"] == forced.json()["id"]  # the newest of the owner's
        other = c.post("/sweeps", json={**RESUBMIT, "description": "changed"})
        assert other.status_code == 201 and other.json()["id"] not in (sid, forced.json()["id"])
        # cancelled, then submitted again: the same sweep, queued again
        assert c.post(f"/sweeps/{forced.json()['id']}/cancel").json()["status"] == "cancelled"
        back = c.post("/sweeps", json=RESUBMIT).json()
        assert back["id"] == forced.json()["id"] and back["existing"] and back["status"] == "pending"
        schema = c.get("/openapi.json").json()["paths"]["/sweeps"]["post"]
        assert {"200", "201"} <= set(schema["responses"]) and "new" in {p["name"] for p in schema["parameters"]}
    with live.client(dave) as c:  # another owner's identical spec is a sweep of their own
        theirs = c.post("/sweeps", json=RESUBMIT)
        assert theirs.status_code == 201 and theirs.json()["owner"] == "dave"
        assert theirs.json()["id"] not in (sid, forced.json()["id"])
        assert c.post("/sweeps", json=RESUBMIT).json()["id"] == theirs.json()["id"]


def test_the_hash_is_stored_indexed_and_old_rows_never_match(live) -> None:
    store = open_services(live.settings).store
    spec = parse_spec({**SPEC, "name": "pre-hash"})
    p = plan(spec)
    old = store.create_sweep(spec.name, spec.model_dump(mode="json"), {}, p.segments)  # as before 0004
    assert store.sweep(old.id).spec_hash is None and store.sweeps_with_spec(spec_hash(spec, p)) == []
    new = store.create_sweep(spec.name, spec.model_dump(mode="json"), {}, p.segments, spec_hash(spec, p))
    assert [s.id for s in store.sweeps_with_spec(spec_hash(spec, p))] == [new.id]
    from sqlalchemy import inspect

    assert "ix_sweeps_spec_hash" in {ix["name"] for ix in inspect(store.engine).get_indexes("sweeps")}


def test_the_same_spec_over_changed_data_is_a_new_sweep(live) -> None:
    corpus = live.settings.data_root_paths[0] / "resubmit-corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    (corpus / "a.txt").write_text("the first version of the corpus\n" * 50)
    body = {**SPEC, "name": "changed-data", "data": {"corpus": str(corpus)}}
    with live.client() as c:
        first = c.post("/sweeps", json=body)
        assert first.status_code == 201, first.text
        assert c.post("/sweeps", json=body).json()["id"] == first.json()["id"]  # same files: the same sweep
        (corpus / "a.txt").write_text("the second version of the corpus\n" * 50)
        changed = c.post("/sweeps", json=body)
        assert changed.status_code == 201 and changed.json()["existing"] is False
        assert changed.json()["id"] != first.json()["id"]
        assert changed.json()["plan"]["new_segments"] == changed.json()["plan"]["segments"]  # every key is new
