"""Sweep progress off a terminal (`upscale demo | cat`, a log file): the live bar cannot redraw there, so stderr gets
a line per finished segment (and one at least every LINE_EVERY_S) with the time left, never minutes of silence and
never `0:00:00` while segments remain. Driven on the road `upscale run` takes (control/runs.py `run_spec`, the real
scheduler on embedded Ray) with the counting segment function (tests/orchestrator/segment_fns.py) and the CLI's
`BarWatch`; pytest's captured stderr is no terminal."""

from __future__ import annotations

import re

import pytest

from tests.orchestrator.conftest import TINY_NAIVE_SPEC, TINY_SPEC
from tests.orchestrator.segment_fns import counting_segment
from upscale.api.cli import progress
from upscale.api.cli.app import err_console
from upscale.control.runs import run_spec
from upscale.control.wiring import open_services
from upscale.orchestrator.scheduler import Scheduler
from upscale.orchestrator.settings import Settings
from upscale.sweeps.loader import load_spec
from upscale.sweeps.planner import plan

pytestmark = pytest.mark.usefixtures("ray_session")
LINE = re.compile(r"^sweep tiny: (\d+)/(\d+) segments, .* tokens, \d+:\d\d:\d\d elapsed, (time left (.+)|done)$")


@pytest.mark.slow  # ~15 s on CI's 2 cores (make test stays under 10 minutes)
def test_piped_progress_prints_a_line_per_finished_segment_with_the_time_left(tmp_path, mlflow_uri, capsys) -> None:
    settings = Settings(home=tmp_path, mlflow_tracking_uri=mlflow_uri)
    services = open_services(settings)
    orch = services.orch
    orch.run(load_spec(TINY_NAIVE_SPEC), Scheduler(orch.store, settings, segment_fn=counting_segment, poll_s=0.05))
    reused = len(plan(load_spec(TINY_NAIVE_SPEC)).segments)
    spec = load_spec(TINY_SPEC)
    capsys.readouterr()
    assert not err_console.is_terminal  # so lines, not a live display nobody sees
    out = run_spec(services, spec, progress.BarWatch(), segment_fn=counting_segment).outcome
    # the road's notes (a one-time op build ahead, the token cache built) come before the sweep's lines
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sweep tiny: ")]
    parsed = [LINE.match(line) for line in lines]
    assert all(parsed), lines
    done = [int(m[1]) for m in parsed]
    total = len(plan(spec).segments)
    # the first line on the first event (the reused half already done), then one per change, the last one done
    assert done[0] == reused and done[-1] == total and done == sorted(set(done)), lines
    assert len(lines) >= 3 and parsed[-1][3] == "done"
    for m in parsed[:-1]:
        assert m[4] is not None and m[4] != "0:00:00", lines  # segments remain: a time left, and not zero
    assert len(out.trained) == total - reused


def test_with_no_segment_finishing_a_line_still_comes_every_interval(monkeypatch, capsys) -> None:
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    with progress.sweep_bar("sweep s") as bar:
        bar.update(set(), 4, "running", time_left_s=600.0, told=True)
        bar.update(set(), 4, "running", time_left_s=590.0, told=True)  # nothing finished: still a line
        bar.update({"a", "b", "c", "d"}, 4, "done", time_left_s=0.0, told=True)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3, lines
    assert lines[0].startswith("sweep s: 0/4 segments, 0:00:00 elapsed, time left 0:10:00, running"), lines
    assert "time left 0:09:50" in lines[1] and lines[2].endswith("elapsed, done"), lines
