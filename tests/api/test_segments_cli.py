"""`upscale segments` and the axes of `upscale status`, in-process on a temporary UPSCALE_HOME: a tiny sweep is
recorded without training, its segment specs are exported, and `upscale train-segment` trains the exported dense
trunk for real (a nano model, a few steps on CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.orchestrator.conftest import TINY_SPEC
from upscale.api.cli import app
from upscale.api.cli.segment_commands import axes_text
from upscale.orchestrator.service import Orchestrator
from upscale.orchestrator.settings import Settings, get_settings
from upscale.sweeps.loader import load_spec
from upscale.sweeps.planner import plan
from upscale.sweeps.segments import SegmentSpec


@pytest.fixture
def recorded(tmp_path, mlflow_uri, monkeypatch):
    """(CliRunner invoke, sweep id) of TINY_SPEC recorded in a fresh store, nothing trained."""
    monkeypatch.setenv("UPSCALE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    get_settings.cache_clear()
    sweep = Orchestrator.open(Settings(home=tmp_path / "home", mlflow_tracking_uri=mlflow_uri)).submit(
        load_spec(TINY_SPEC))
    runner = CliRunner()

    def invoke(*args: str) -> str:
        result = runner.invoke(app, list(args), catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.stdout

    yield invoke, sweep.id
    get_settings.cache_clear()


def test_status_shows_the_axes_that_tell_segments_apart(recorded) -> None:
    invoke, sweep_id = recorded
    decays = [s for s in plan(load_spec(TINY_SPEC)).segments if s.spec.kind == "moe_decay"]
    texts = {axes_text(s.axes) for s in decays}
    assert len(decays) == 8 and len(texts) == 8  # (naive, drop) x D1 x D2: every row told apart
    assert "method=drop r=0.5 D2=512" in axes_text(decays[-1].axes) and "D=" not in axes_text(decays[-1].axes)
    status = invoke("status", sweep_id)
    assert "method=naive" in status and "method=drop" in status and "D2=256" in status


@pytest.mark.slow  # trains a segment: ~50 s on 2 cores
def test_exported_segments_train_with_train_segment(recorded, tmp_path: Path) -> None:
    invoke, sweep_id = recorded
    specs = json.loads(invoke("segments", sweep_id, "--json"))
    planned = plan(load_spec(TINY_SPEC)).segments
    assert [SegmentSpec.model_validate(s).id for s in specs] == [s.id for s in planned]  # exact, in plan order
    table = invoke("segments", sweep_id)
    assert planned[0].id in table and "pending" in table
    out = tmp_path / "specs"
    invoke("segments", sweep_id, "--out", str(out))
    assert {p.stem for p in out.glob("*.json")} == {s.id for s in planned}
    trunk = planned[0]
    assert trunk.spec.kind == "dense_trunk" and not trunk.spec.parent_ids
    result = json.loads(invoke("train-segment", str(out / f"{trunk.id}.json"), "--json", "--checkpoint-dir",
                               str(tmp_path / "ckpt")))
    assert result["tokens"] == trunk.tokens and Path(result["checkpoint"]).is_dir()


def test_an_unknown_sweep_is_one_error_line(recorded) -> None:
    result = CliRunner().invoke(app, ["segments", "nope"])
    assert result.exit_code != 0 and isinstance(result.exception, Exception) and "no sweep 'nope'" in str(
        result.exception)
