"""The CLI's two roads give one answer: `Local` (in-process calls into control/) and `upscale.Client` (`--api`, a real
uvicorn server on the same store) return the same JSON for the sweep reads, observations and cancel, and a command
prints the same with and without `--api`. `upscale --help` lists its commands under the four panels, in order."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from tests.orchestrator.conftest import TINY_SPEC
from upscale.api.cli import COMMANDS, app
from upscale.api.cli.local import Local, connect
from upscale.client import Client
from upscale.orchestrator.settings import get_settings
from upscale.sweeps.segments import SegmentResult


@pytest.fixture
def on_live_store(live, mlflow_uri, monkeypatch):
    """The in-process CLI pointed at the live server's store; the server's read token."""
    monkeypatch.setenv("UPSCALE_HOME", str(live.settings.home))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    monkeypatch.delenv("UPSCALE_TOKEN", raising=False)
    get_settings.cache_clear()
    yield live.write["Authorization"].split()[1]
    get_settings.cache_clear()


def _unclocked(text: str) -> str:
    """A status print without the figures read off the clock at the moment of printing (time elapsed and left)."""
    return re.sub(r"[0-9.]+ s elapsed|time left [0-9:]+|\(at [0-9:]+ UTC\)", "<clock>", text)


def test_local_and_api_give_the_same_json(live, on_live_store, tmp_path) -> None:
    token = on_live_store
    spec = tmp_path / "tiny.yaml"
    spec.write_text(TINY_SPEC.replace("name: tiny", "name: two-roads"))
    with Client(live.url, token) as remote, Local() as local:
        assert isinstance(connect(None, None), Local) and isinstance(connect(live.url, token), Client)
        created = remote.submit(spec)
        sid = created["id"]
        again = local.submit(spec)  # LOCAL_OWNER has no sweep of this spec: a new one, planned alike
        assert again["plan"] == created["plan"] and again["owner"] == "local" and not again["existing"]
        store = live.app.state.services.store
        decay = next(seg for seg, _ in store.members(sid) if seg.kind == "moe_decay")
        attempt = store.claim(decay.key, "host:1:x")
        assert store.complete(decay.key, attempt, SegmentResult(segment_id=decay.key, kind=decay.kind, val_loss=3.0,
                                                                tokens=1, wall_s=1.0, tokens_per_s=1.0,
                                                                checkpoint="/ck/x"))
        assert local.sweeps() == remote.sweeps()
        here, there = local.sweep(sid), remote.sweep(sid)
        for clock in ("elapsed_s", "time_left_s", "as_of"):  # read at two moments: the rest must agree exactly
            here["timing"].pop(clock), there["timing"].pop(clock)
        assert here == there
        for kind in (None, "upcycled", "dense"):
            assert local.observations_csv(sid, kind) == remote.observations_csv(sid, kind)
        assert local.observations(sid, "upcycled").equals(remote.observations(sid, "upcycled"))
        assert len(local.observations(sid)) == 1
        assert local.analyses() == remote.analyses() == []
        assert local.cancel(again["id"]) == next(s for s in remote.sweeps() if s["id"] == again["id"])

    runner = CliRunner(env={"COLUMNS": "200"})
    for args in (["status", sid], ["status"], ["observations", sid, "--csv"]):
        here = runner.invoke(app, args, catch_exceptions=False)
        there = runner.invoke(app, [*args, "--api", live.url, "--token", token], catch_exceptions=False)
        assert here.exit_code == there.exit_code == 0, (here.stdout, there.stdout)
        assert _unclocked(here.stdout) == _unclocked(there.stdout), (here.stdout, there.stdout)
    assert runner.invoke(app, ["sweeps"]).stdout == runner.invoke(app, ["status"]).stdout  # one listing


def test_help_lists_the_commands_under_four_panels_in_order() -> None:
    out = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["--help"]).stdout
    panels = ["Sweeps", "Analysis", "Models", "Service"]
    at = [out.index(f"─ {p} ─") for p in panels]
    assert at == sorted(at), out
    assert [c[2] for c in COMMANDS] == sorted((c[2] for c in COMMANDS), key=panels.index)  # grouped in the table
    names = [c[0] for c in COMMANDS]
    assert len(names) == len(set(names)) == 28
    for name, _, panel, _ in COMMANDS:
        i = panels.index(panel)
        end = at[i + 1] if i + 1 < len(at) else len(out)
        assert f" {name} " in out[at[i]:end], (name, panel)
