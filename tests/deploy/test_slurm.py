"""`upscale slurm submit` against a real SLURM (tests/deploy/slurm_cluster.py: slurmctld and slurmd for this one
node): the micro sweep's job starts Ray inside the allocation as deploy/slurm/upscale.sbatch does, finishes with every
observation in the store under its UPSCALE_HOME, and `upscale status` shows it; a partition SLURM does not know is
refused in one line, leaving nothing behind; a job requeued mid-sweep (`scontrol requeue`: SLURM kills it and runs it
again, as after a preemption) resumes the sweep, training each segment once. Skipped with the reason where SLURM
cannot start (not installed, not root, no job runs). `.ci/run` runs these after `make test` (`pytest -m slurm`)."""

from __future__ import annotations

import contextlib
import re
import shutil
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.test_cli import UPSCALE
from tests.api.test_cli_errors import _fails
from tests.deploy.conftest import MICRO_SPEC
from tests.deploy.slurm_cluster import SlurmUnavailable, _free_port, local_slurm
from upscale.orchestrator.store import Store

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
JOB_TIMEOUT_S = 900
OBSERVATIONS = 3  # MICRO_SPEC's: dense, upcycled and scratch, one each


@pytest.fixture(scope="module")
def slurm() -> Iterator[tuple[dict[str, str], Path]]:
    """The cluster's environment (SLURM_CONF), and its temp folder, which also holds each test's UPSCALE_HOME."""
    d = Path(tempfile.mkdtemp(prefix="upscale-slurm-"))  # not pytest's tmp_path: munged wants a searchable path
    try:
        with local_slurm(d) as env:
            yield env, d
    except SlurmUnavailable as e:
        pytest.skip(str(e))
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _submit(env: dict[str, str], d: Path, name: str) -> tuple[str, Path, dict[str, str]]:
    """Submit the micro sweep through `upscale slurm submit`; returns the job id, its UPSCALE_HOME and env."""
    home = d / name
    home.mkdir()
    spec = home / "micro.yaml"
    spec.write_text(MICRO_SPEC)
    # Ray's ports: free ones, so that no other Ray on this host is in the way (sbatch passes this environment on).
    job_env = {**env, "UPSCALE_HOME": str(home), "UPSCALE_RAY_PORT": str(_free_port()),
               "UPSCALE_RAY_CLIENT_PORT": str(_free_port()),
               "UPSCALE_RAY_START_ARGS": f"--dashboard-agent-listen-port={_free_port()}"}
    r = subprocess.run([UPSCALE, "slurm", "submit", str(spec), "--cpus-per-node", "2", "--time", "30:00"],
                       env=job_env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip()
    assert re.fullmatch(r"\d+", job_id), r.stdout
    return job_id, home, job_env


def _job(env: dict[str, str], job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=env, capture_output=True, text=True).stdout
    return dict(field.split("=", 1) for field in out.split() if "=" in field)


def _log(home: Path) -> str:
    return "\n".join(p.read_text(errors="replace")[-4000:] for p in (home / "slurm").glob("*.out"))


def _wait_for_end(env: dict[str, str], job_id: str, home: Path) -> dict[str, str]:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while (job := _job(env, job_id)).get("JobState") not in {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                                              "NODE_FAIL", "OUT_OF_MEMORY"}:
        assert time.monotonic() < deadline, f"job {job_id} still {job.get('JobState')}: {_log(home)}"
        time.sleep(2)
    assert job["JobState"] == "COMPLETED", f"job {job_id} {job['JobState']}: {_log(home)}"
    return job


def _done_segments(home: Path) -> set[str]:
    """The keys of the segments done so far, read without opening a Store: opening one migrates, which must not race
    the job's own first opening of the database."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{home / 'upscale.db'}?mode=ro", uri=True)) as db:
            return {key for (key,) in db.execute("SELECT key FROM segments WHERE status = 'done'")}
    except sqlite3.OperationalError:  # no database or no table yet
        return set()


def _the_sweep(home: Path) -> tuple[Store, str]:
    store = Store(f"sqlite:///{home / 'upscale.db'}")
    (sweep,) = store.sweeps()
    return store, sweep.id


def test_a_submitted_sweep_finishes_with_every_observation(slurm) -> None:
    env, d = slurm
    job_id, home, job_env = _submit(env, d, "finish")
    _wait_for_end(env, job_id, home)
    store, sweep_id = _the_sweep(home)
    assert store.sweep(sweep_id).status == "done", _log(home)
    assert len(store.observations(sweep_id)) == OBSERVATIONS
    log = _log(home)
    assert "Ray ready: 1 node(s)" in log and "sweep settled (upscale run exited 0)" in log, log
    status = subprocess.run([UPSCALE, "status"], env=job_env, capture_output=True, text=True, timeout=120)
    assert status.returncode == 0 and sweep_id in status.stdout and "done" in status.stdout, status.stdout


def test_a_partition_slurm_rejects_is_one_line_and_leaves_nothing(slurm) -> None:
    env, d = slurm
    spec = d / "rejected.yaml"
    spec.write_text(MICRO_SPEC)
    home = d / "rejected"
    line = _fails({**env, "UPSCALE_HOME": str(home)}, "slurm", "submit", str(spec), "--partition", "nosuch")
    assert line.startswith("error: sbatch refused the job:") and "invalid partition" in line.lower(), line
    assert not home.exists()


def test_a_requeued_job_resumes_the_sweep_training_each_segment_once(slurm) -> None:
    env, d = slurm
    job_id, home, _ = _submit(env, d, "requeue")
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not (done_before := _done_segments(home)):  # requeue once a segment is done, and before the sweep is
        assert time.monotonic() < deadline, _log(home)
        time.sleep(1)
    subprocess.run(["scontrol", "requeue", job_id], env=env, check=True, capture_output=True)
    job = _wait_for_end(env, job_id, home)
    assert int(job["Restarts"]) == 1
    store, sweep_id = _the_sweep(home)
    assert store.sweep(sweep_id).status == "done"
    assert len(store.observations(sweep_id)) == OBSERVATIONS
    assert len(done_before) < len(store.members(sweep_id))  # it was requeued mid-sweep
    for seg, _ in store.members(sweep_id):
        finished = [a for a in store.attempts(seg.key) if a.status in {"done", "adopted"}]
        assert len(finished) == 1, (seg.kind, [(a.number, a.status) for a in store.attempts(seg.key)])
        if seg.key in done_before:  # trained before the requeue: never started again
            assert len(store.attempts(seg.key)) == 1
