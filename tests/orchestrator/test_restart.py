"""The scheduler process killed mid-sweep (SIGKILL to its whole process group: driver, embedded Ray) and
restarted finishes the sweep with every segment trained to completion exactly once.

Strategy: run `sweep_process.py` as a subprocess with slow steps, kill it once some segments are done and some are
running, restart it, and count `end` events per segment. Segments the dead scheduler left running are adopted (their
worker outlived the driver and left a result) or re-queued and resumed from their checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.orchestrator.conftest import TINY_SPEC
from upscale.orchestrator.service import Orchestrator
from upscale.sweeps.loader import load_spec
from upscale.sweeps.planner import plan

SCRIPT = Path(__file__).parent / "sweep_process.py"


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow  # two scheduler processes with slow steps: ~60 s on 2 cores
def test_a_killed_scheduler_restarted_trains_each_segment_once(settings) -> None:
    orch = Orchestrator.open(settings)
    spec = load_spec(TINY_SPEC)
    sweep = orch.submit(spec)
    root = Path(settings.checkpoint_dir)
    root.mkdir(parents=True)
    (root / "knobs.json").write_text(json.dumps({"step_s": 0.05}))
    args = [sys.executable, str(SCRIPT), str(settings.home), settings.mlflow_tracking_uri, sweep.id]
    log = settings.home / "first-run.log"
    proc = subprocess.Popen(args, start_new_session=True, stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300  # Ray's start alone took 30 s on the shared 2 cores
    while time.monotonic() < deadline:
        events = _events(root / "events.jsonl")
        ended = {e["segment"] for e in events if e["event"] == "end"}
        started = {e["segment"] for e in events if e["event"] == "start"}
        if len(ended) >= 3 and started - ended:
            break
        assert proc.poll() is None, f"the scheduler process exited early:\n{log.read_text()[-3000:]}"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert len(ended) >= 3 and started - ended, f"no mid-sweep moment to kill at: {len(ended)} done"
    members = [s for s, _ in orch.store.members(sweep.id)]
    running = [s.key for s in members if s.status == "running"]
    assert running, "the kill should catch segments mid-run"
    # what the restart owes: every segment the store did not record as done (an `end` event can precede the dead
    # scheduler's record of it, and then the restart adopts it)
    owed = sum(s.status != "done" for s in members)
    (root / "knobs.json").write_text(json.dumps({"step_s": 0.0}))
    restarted = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert restarted.returncode == 0, restarted.stdout
    status, trained, adopted = restarted.stdout.split()[-3:]
    ends = Counter(e["segment"] for e in _events(root / "events.jsonl") if e["event"] == "end")
    assert status == "done" and ends == Counter({s.id: 1 for s in plan(spec).segments})
    assert int(trained) + int(adopted) == owed
    attempts = [a.status for key in running for a in orch.store.attempts(key)]
    assert set(attempts) <= {"adopted", "orphaned", "done"} and attempts.count("orphaned") == attempts.count("done")
