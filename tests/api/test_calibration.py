"""GET /sweeps/{id}/calibration and `upscale calibration` on a live server's store: predictions written down for a
sweep's observation segments are scored by the store when the segments complete (as a scheduler records them), and
the route and the CLI report the same coverage and mean absolute error; an unknown sweep is a 404 and a user error."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests.orchestrator.conftest import TINY_SPEC
from upscale.api.cli import app
from upscale.api.cli.app import user_errors
from upscale.control.records import PredictionRecord
from upscale.orchestrator.errors import NotFoundError
from upscale.orchestrator.settings import get_settings
from upscale.sweeps.loader import load_spec
from upscale.sweeps.planner import plan
from upscale.sweeps.segments import SegmentResult


def test_the_ledger_is_scored_and_served_by_the_route_and_the_cli(live, mlflow_uri, monkeypatch) -> None:
    store = live.app.state.services.store
    p = plan(load_spec(TINY_SPEC.replace("name: tiny", "name: ledger-route")))
    sweep = store.create_sweep("ledger-route", {}, {"cpus": 1}, p.segments)
    decays = [s for s in p.segments if s.observation is not None and s.observation.kind == "upcycled"][:4]
    with store.transaction() as s:
        for d in decays:
            s.add(PredictionRecord(sweep_id=sweep.id, segment_key=d.id, analysis_id="a1", law="upcycled naive 4x1",
                                   predicted=3.0, sigma_fit=0.01, sigma_noise=0.02, lo80=2.9, hi80=3.1, lo95=2.8,
                                   hi95=3.2))
    with live.client(live.read) as c:
        pending = c.get(f"/sweeps/{sweep.id}/calibration").json()
        assert pending["predicted"] == 4 and pending["scored"] == 0 and pending["coverage_80"] is None

    losses = [3.0, 3.05, 2.95, 3.15]  # the last is outside the 80% interval, inside the 95% one
    for d, loss in zip(decays, losses, strict=True):
        attempt = store.claim(d.id, "host:1:x")
        assert store.complete(d.id, attempt, SegmentResult(segment_id=d.id, kind=d.spec.kind, val_loss=loss, tokens=1,
                                                           wall_s=1.0, tokens_per_s=1.0, checkpoint=f"/ck/{d.id}"))
    with live.client(live.read) as c:
        got = c.get(f"/sweeps/{sweep.id}/calibration")
        assert got.status_code == 200
        cal = got.json()
        assert cal["scored"] == 4 and cal["coverage_80"] == 0.75 and cal["coverage_95"] == 1.0
        assert cal["mae"] == pytest.approx((0 + 0.05 + 0.05 + 0.15) / 4)
        assert cal["by_law"]["upcycled naive 4x1"]["scored"] == 4 and cal["analyses"] == ["a1"]
        assert [r["inside_80"] for r in cal["predictions"]] == [True, True, True, False]
        missing = c.get("/sweeps/nosuchsweep/calibration")
        assert missing.status_code == 404 and "nosuchsweep" in missing.text

    monkeypatch.setenv("UPSCALE_HOME", str(live.settings.home))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    get_settings.cache_clear()
    try:
        runner = CliRunner()
        as_json = runner.invoke(app, ["calibration", sweep.id, "--json"], catch_exceptions=False)
        assert as_json.exit_code == 0 and json.loads(as_json.stdout) == cal
        shown = runner.invoke(app, ["calibration", sweep.id], catch_exceptions=False)
        assert shown.exit_code == 0 and "75%" in shown.stdout and "100%" in shown.stdout
        unknown = runner.invoke(app, ["calibration", "nosuchsweep"])  # main() prints it as one `error:` line
        assert isinstance(unknown.exception, NotFoundError) and isinstance(unknown.exception, user_errors())
        assert "no sweep 'nosuchsweep'" in str(unknown.exception)
    finally:
        get_settings.cache_clear()
