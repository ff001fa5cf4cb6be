"""Refit schedules from the command line against a real server: the README's refit commands, run by bash as printed
(only the server's URL and the sweep id put in), create a cron schedule, list it, refit twice on unchanged
observations (one version), show the history and delete it; then a new observation makes the next refit a second
version with its diff, and `upscale_refit_age_seconds` follows the schedule's lag behind its observations.

The server has no background loops, so only the commands refit. Its store is filled as the scheduler fills it
(tests/api/test_analysis.py `fill`), so the analyses fit real laws without training anything."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.api.conftest import Live, serve
from tests.api.test_analysis import add_last_observation, fill
from upscale.orchestrator.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def readme_refit_block() -> str:
    """The README's bash block that creates a refit schedule."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    (block,) = [b for b in blocks if "upscale refit schedule create" in b]
    return block


@pytest.fixture(scope="module")
def world(tmp_path_factory, mlflow_uri):
    settings = Settings(home=tmp_path_factory.mktemp("refits"), mlflow_tracking_uri=mlflow_uri)
    with serve(settings, scheduler=False) as live:
        services = live.app.state.services
        yield live, services, fill(services, leave_out=1)


def _env(live: Live, tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "UPSCALE_HOME": str(tmp_path),
            "UPSCALE_TOKEN": live.write["Authorization"].split()[1], "COLUMNS": "250"}


def _cli(env: dict[str, str], *args: str) -> str:
    r = subprocess.run([str(BIN / "upscale"), *args], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@pytest.mark.slow  # a real server, the README block run by bash, two analyses: ~25 s on 2 cores
def test_the_readme_refit_commands_over_the_api(world, tmp_path) -> None:
    live, _, sweep = world
    block = readme_refit_block()
    script = re.sub(r"^API=\S+", f"API={live.url}", block, count=1, flags=re.M)
    script = re.sub(r"^SWEEP=\S+", f"SWEEP={sweep}", script, count=1, flags=re.M)
    assert script.count(live.url) == 1 and script.count(sweep) == 1, "the block sets API and SWEEP once each"
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", script], env=_env(live, tmp_path), capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr

    with live.client() as c:
        (schedule,) = [s for s in c.get("/refit-schedules", params={"all": True}).json() if s["name"] == "nightly"]
        versions = c.get("/refits", params={"schedule_id": schedule["id"]}).json()
    sid = schedule["id"]
    assert (schedule["name"], schedule["trigger"], schedule["cron"]) == ("nightly", "cron", "0 3 * * *")
    assert schedule["request"] == {"sweep_ids": [sweep], "bootstrap": 100, "n1": None}  # the defaults, shown
    assert not schedule["active"] and schedule["last_error"] is None  # deleted by the block's last line
    assert [v["version"] for v in versions] == [1]  # fired twice on the same observations: one version
    assert versions[0]["dstar_answer"]["intervals"]["95"] is not None  # bootstrapped by default: an interval

    out, err = run.stdout, run.stderr
    assert f"refit schedule {sid} (nightly): cron '0 3 * * *' (UTC)" in err and "100 bootstrap refits" in err
    assert re.search(rf"{sid} .*nightly.*cron '0 3 \* \* \*'.*the largest size trained.* 0 .*active", out)  # list
    assert f"schedule {sid} v1; analysis {versions[0]['analysis_id']}, D* at N1=" in out  # the first run
    assert f"schedule {sid} v1 again: the observations have not changed since it, nothing recorded" in out
    v1 = versions[0]
    assert re.search(rf"{sid}\W+1\W+{v1['created_at'][:10]}.*{v1['analysis_id']}", out)  # history
    assert f"deleted refit schedule {sid}" in err


# Two analyses and six console-script starts, ~30 s on 2 cores (tests/control/test_refits.py: the lag, in-process).
@pytest.mark.slow
def test_new_observations_make_the_next_version_and_the_lag_follows_them(world, tmp_path) -> None:
    live, services, sweep = world
    env = _env(live, tmp_path)
    api = ("--api", live.url)
    created = json.loads(_cli(env, "refit", "schedule", "create", sweep, "--bootstrap", "10", "--json", *api))
    sid = created["id"]
    assert created["trigger"] == "on_new_observations" and created["cron"] is None

    def lag() -> float:
        with live.client() as c:
            text = c.get("/metrics").text
        return float(re.search(rf'^upscale_refit_age_seconds{{schedule="{sid}"}} (\S+)$', text, re.M).group(1))

    assert lag() > 0  # observations no version has seen
    (v1,) = json.loads(_cli(env, "refit", "run", sid, "--json", *api))
    assert (v1["version"], v1["unchanged"], v1["diff"]) == (1, False, {})
    assert lag() == 0
    add_last_observation(services, sweep)
    assert lag() > 0
    (v2,) = json.loads(_cli(env, "refit", "run", sid, "--json", *api))
    assert (v2["version"], v2["unchanged"]) == (2, False) and v2["analysis_id"] != v1["analysis_id"]
    assert {"scratch", "upcycled naive 4x2"} <= set(v2["diff"]) and v2["inputs_hash"] != v1["inputs_hash"]
    assert lag() == 0
    history = json.loads(_cli(env, "refit", "history", sid, "--json", *api))
    assert [v["version"] for v in history] == [1, 2] and history[1] == {k: v for k, v in v2.items()
                                                                       if k != "unchanged"}
    bad = subprocess.run([str(BIN / "upscale"), "refit", "schedule", "create", sweep, "--cron", "61 * * * *", *api],
                         env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error:") and "minute" in bad.stderr, bad.stderr


def test_in_process_the_same_commands_act_on_the_local_store(world, mlflow_uri, monkeypatch) -> None:
    """Without --api the commands call control/ on this machine's store (UPSCALE_HOME, here the server's): what they
    create, the server lists alike; errors say what to fix."""
    from typer.testing import CliRunner

    from upscale.api.cli import app
    from upscale.api.cli.app import CommandError
    from upscale.client import Client
    from upscale.orchestrator.settings import get_settings

    live, _, sweep = world
    monkeypatch.setenv("UPSCALE_HOME", str(live.settings.home))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    get_settings.cache_clear()
    try:
        runner = CliRunner()
        created = runner.invoke(app, ["refit", "schedule", "create", sweep, "--n1", "2e4", "--json"])
        assert created.exit_code == 0, created.output
        schedule = json.loads(created.stdout)
        assert schedule["owner"] == "local" and schedule["request"] == {"sweep_ids": [sweep], "bootstrap": 100,
                                                                        "n1": 2e4}
        with Client(live.url, live.read["Authorization"].split()[1]) as api:
            assert schedule in api.refit_schedules()
        listed = runner.invoke(app, ["refit", "schedule", "list", "--json"])
        assert schedule in json.loads(listed.stdout)
        assert json.loads(runner.invoke(app, ["refit", "history", schedule["id"], "--json"]).stdout) == []
        assert runner.invoke(app, ["refit", "schedule", "delete", schedule["id"]]).exit_code == 0
        assert schedule["id"] not in {s["id"] for s in json.loads(runner.invoke(
            app, ["refit", "schedule", "list", "--json"]).stdout)}
        for args, fix in ((["schedule", "delete", "0" * 12], "`upscale refit schedule list --all` lists them"),
                          (["schedule", "create", sweep, "--cron", "* * *"], "needs 5 fields"),
                          (["run", "0" * 12], "no refit schedule '000000000000'")):
            failed = runner.invoke(app, ["refit", *args])
            assert isinstance(failed.exception, CommandError) and fix in str(failed.exception), failed.output
    finally:
        get_settings.cache_clear()
