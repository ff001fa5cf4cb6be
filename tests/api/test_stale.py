"""POST /sweeps after a training-semantics bump: the response lists the stale segments (the store holds the same jobs
trained under the older version) and counts them as new; `reuse_stale=true` takes their results over, on the
caller's existing sweep too, and GET /sweeps/{id} says so. A live server without background loops (nothing trains):
the older version's segments are recorded done through the store, as a scheduler would."""

from __future__ import annotations

from tests.api.test_auth_validation import SPEC
from upscale.sweeps import segments
from upscale.sweeps.planner import plan
from upscale.sweeps.segments import SegmentResult
from upscale.sweeps.spec import parse_spec

STALE = {**SPEC, "name": "stale"}


def test_stale_segments_are_reported_and_reused_only_when_asked(live, monkeypatch) -> None:
    store = live.app.state.services.store
    old = plan(parse_spec(STALE))
    store.create_sweep("before", {}, {"cpus": 1}, old.segments)
    for s in old.segments:  # done under version 1, with a checkpoint at every branch point
        attempt = store.claim(s.id, "host:1:x")
        store.complete(s.id, attempt, SegmentResult(
            segment_id=s.id, kind=s.spec.kind, val_loss=3.0 if s.observation else None, tokens=s.tokens, wall_s=1.0,
            tokens_per_s=1.0, checkpoint=f"/ck/{s.id}/final",
            branch_checkpoints={t: f"/ck/{s.id}/{t}" for t in s.spec.save_at_tokens}))

    monkeypatch.setattr(segments, "TRAINING_SEMANTICS", 2)
    new = plan(parse_spec(STALE))
    expected = {n.id: o.id for n, o in zip(new.segments, old.segments, strict=True)}
    with live.client() as c:
        first = c.post("/sweeps", json=STALE)
        assert first.status_code == 201 and not first.json()["reuse_stale"]
        p = first.json()["plan"]
        assert p["stale_segments"] == expected and p["new_segments"] == p["segments"] == len(new.segments)
        assert p["new_tokens"] == p["tokens"] == sum(s.tokens for s in new.segments)
        sid = first.json()["id"]
        assert c.get(f"/sweeps/{sid}").json()["stale_segments"] == expected

        reused = c.post("/sweeps", json=STALE, params={"reuse_stale": "true"})  # the caller's sweep: taken over
        assert reused.status_code == 200 and reused.json()["existing"] and reused.json()["id"] == sid
        assert reused.json()["reuse_stale"] and reused.json()["plan"]["new_segments"] == 0
        assert reused.json()["plan"]["new_tokens"] == 0 and reused.json()["plan"]["new_flops"] == 0
        detail = c.get(f"/sweeps/{sid}").json()
        assert detail["reuse_stale"] and detail["segments_done"] == len(new.segments)
        assert {s["key"]: s["reused_from"] for s in detail["segments"]} == expected
        assert {s["key"]: s["val_loss"] for s in detail["segments"] if s["val_loss"] is not None} == {
            s.id: 3.0 for s in new.segments if s.observation}

        again = c.post("/sweeps", json=STALE, params={"new": "true", "reuse_stale": "true"})
        assert again.status_code == 201 and again.json()["plan"]["stale_segments"] == {}  # nothing stale now
        missing = c.post("/sweeps/nosuchsweep/extend", json={"additions": {}, "reuse_stale": True})
        assert missing.status_code == 404
        schema = c.get("/openapi.json").json()["paths"]["/sweeps"]["post"]
        assert any(q["name"] == "reuse_stale" for q in schema["parameters"])
