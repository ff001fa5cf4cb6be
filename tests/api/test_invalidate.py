"""A done segment whose checkpoint is corrupt or lost can be invalidated: it and every segment trained from it go
back to pending, and the next scheduler run retrains exactly those, from scratch (their checkpoint folders are gone),
while every other segment stays trained once. Over the admin route (a write or read token is refused 403, nothing
changed), with `upscale segments invalidate` in-process and over --api, and refused with 409 while one of them runs.

Strategy: the tiny sweep trained by the real scheduler on embedded Ray with the counting segment function
(tests/orchestrator/segment_fns.py, which logs each start with the tokens it resumed from and each end), a real
uvicorn server without background loops on the same SQLite store, and the real CLI through typer's runner."""

from __future__ import annotations

import httpx
import pytest
from typer.testing import CliRunner

from tests.api.conftest import serve
from tests.orchestrator.conftest import TINY_SPEC
from tests.orchestrator.segment_fns import counting_segment
from tests.orchestrator.test_scheduler import ends, events
from upscale.api.cli import app
from upscale.control.tokens import create_token
from upscale.orchestrator.records import CheckpointRecord, ObservationRecord
from upscale.orchestrator.scheduler import Scheduler
from upscale.orchestrator.service import Orchestrator
from upscale.orchestrator.settings import Settings, get_settings
from upscale.sweeps.loader import load_spec
from upscale.sweeps.planner import plan

pytestmark = pytest.mark.usefixtures("ray_session")


def trained_from(key: str) -> set[str]:
    """``key`` and its descendants in the tiny sweep's plan."""
    children: dict[str, set[str]] = {}
    for s in plan(load_spec(TINY_SPEC)).segments:
        for parent in s.spec.parent_ids:
            children.setdefault(parent, set()).add(s.id)
    found, todo = set(), [key]
    while todo:
        k = todo.pop()
        if k not in found:
            found.add(k)
            todo += children.get(k, ())
    return found


def test_an_invalidated_segment_and_its_descendants_are_retrained_once_more(tmp_path, mlflow_uri,
                                                                            monkeypatch) -> None:
    settings = Settings(home=tmp_path / "home", mlflow_tracking_uri=mlflow_uri)
    orch = Orchestrator.open(settings)
    sweep = orch.submit(load_spec(TINY_SPEC))

    def run() -> str:
        return Scheduler(orch.store, settings, segment_fn=counting_segment, poll_s=0.05,
                         checkpoint_every_tokens=64).run(sweep.id).status

    assert run() == "done" and set(ends(settings).values()) == {1}
    segments = plan(load_spec(TINY_SPEC)).segments
    upcycle = next(s.id for s in segments if s.spec.kind == "upcycle")
    expected = trained_from(upcycle)
    assert 1 < len(expected) < len(segments)
    with orch.store.transaction() as s:
        observed_before = s.query(ObservationRecord).count()

    with serve(settings, scheduler=False) as live:
        admin = {"Authorization": f"Bearer {create_token(orch.store, 'admin', 'carol')}"}
        url = f"{live.url}/segments/{upcycle}/invalidate"
        for headers in (live.write, live.read):  # a write token owns no segment: refused, nothing changed
            assert httpx.post(url, headers=headers).status_code == 403
        assert orch.store.segment(upcycle).status == "done"
        assert httpx.post(f"{live.url}/segments/{'0' * 16}/invalidate", headers=admin).status_code == 404
        assert httpx.post(f"{live.url}/segments/not-a-key/invalidate", headers=admin).status_code == 422
        r = httpx.post(url, headers=admin)
        assert r.status_code == 200, r.text
        assert set(r.json()["segments"]) == expected and r.json()["sweeps"] == [sweep.id]
        assert r.json()["by"] == "carol"
        assert httpx.post(url, headers=admin).status_code == 409  # pending now: nothing to invalidate

    assert orch.store.sweep(sweep.id).status == "pending"  # a sweep loop picks it up again
    for key in expected:
        seg = orch.store.segment(key)
        assert seg.status == "pending" and seg.result is None and "carol" in seg.error
        assert [(a.status, a.owner) for a in orch.store.attempts(key)][-1] == ("invalidated", "carol")
    with orch.store.transaction() as s:
        assert s.query(CheckpointRecord).filter(CheckpointRecord.segment_key.in_(expected)).count() == 0
        invalidated_observations = sum(1 for key in expected if orch.store.segment(key).observation)
        assert s.query(ObservationRecord).count() == observed_before - invalidated_observations

    starts_before = len(events(settings))
    assert run() == "done"
    assert {k for k, n in ends(settings).items() if n == 2} == expected  # exactly those trained again
    assert set(ends(settings).values()) == {1, 2}
    again = [e for e in events(settings)[starts_before:] if e["event"] == "start"]
    by_key = {s.id: s.spec for s in segments}
    assert all(e["tokens"] == by_key[e["segment"]].start_tokens for e in again)  # from scratch: no stale resume

    # the CLI: in-process (the operator holds the store) and over --api, where a write token is refused
    monkeypatch.setenv("UPSCALE_HOME", str(settings.home))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    get_settings.cache_clear()
    try:
        last = segments[-1].id  # a leaf: only itself
        cli = CliRunner()
        with serve(settings, scheduler=False) as live:
            token = live.write["Authorization"].removeprefix("Bearer ")
            refused = cli.invoke(app, ["segments", "invalidate", last, "--api", live.url, "--token", token])
            assert refused.exit_code != 0 and "needs 'admin'" in str(refused.exception)
        assert orch.store.segment(last).status == "done"
        done = cli.invoke(app, ["segments", "invalidate", last])
        assert done.exit_code == 0, done.output
        assert "1 segment(s) marked for retraining" in done.output and orch.store.segment(last).status == "pending"
    finally:
        get_settings.cache_clear()
