"""A real `upscale serve` killed with SIGKILL mid-sweep and started again on the same UPSCALE_HOME finishes the sweep:
the restarted server adopts the sweep whose runner died, every segment done before the kill keeps exactly its
attempts, nothing is trained twice, and the sweep's MLflow run ends FINISHED. A sweep cancelled while its server was
down (left `cancelling` with a dead runner) ends `cancelled` on the next start, its MLflow run KILLED.

Strategy: each server is a subprocess in its own session (uvicorn, the sweep loop and embedded Ray, whose raylet,
GCS and workers are in that session too), killed with `killpg(SIGKILL)`; the sweeps train for real (nano model,
context 16). The test reads the same SQLite store the servers write. Slow: three Ray starts and real training."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx
import psutil
import pytest
from mlflow.tracking import MlflowClient

from tests.api.conftest import free_port
from upscale.control.tokens import create_token
from upscale.orchestrator.records import SweepRecord
from upscale.orchestrator.settings import Settings
from upscale.orchestrator.store import Store

pytestmark = pytest.mark.slow

SPEC = """
name: crash
model: {sizes: [nano]}
moe: {experts: [2], topk: [1]}
upcycling: {methods: [naive, drop]}
tokens: {d1: [256, 512], d2: [128, 256]}
train: {context: 16, batch_size: 4, lr: {dense: 3.0e-3, moe: 2.0e-3}, warmup_tokens: 64}
data: {corpus: "builtin:python-stdlib", tokenizer: bytes, eval_tokens: 512}
resources: {cpus: 1}
"""
UPSCALE = Path(sys.executable).parent / "upscale"


class Orphan:
    """A server whose parent is PID 1, not this test: Popen's `pid`, `poll` and `wait`, read through psutil."""

    def __init__(self, pid: int) -> None:
        self.pid, self._process = pid, psutil.Process(pid)

    def poll(self) -> int | None:
        try:
            return None if self._process.status() != psutil.STATUS_ZOMBIE else -1
        except psutil.NoSuchProcess:
            return -1

    def wait(self, timeout: float) -> None:
        with suppress(psutil.NoSuchProcess):
            self._process.wait(timeout)


@contextmanager
def upscale_serve(settings: Settings, log: Path, *options: str,
                  orphan: bool = False) -> Iterator[tuple[str, subprocess.Popen | Orphan]]:
    """`upscale serve [options]` on a free loopback port, until it answers /healthz; killed (its whole process
    group) at the end. ``orphan``: started by a shell that exits at once, so that its parent is PID 1, as under
    systemd, a container's init, or `nohup` once its shell has gone (skipped where a subreaper adopts it instead)."""
    port = free_port()
    env = {**os.environ, "UPSCALE_HOME": str(settings.home), "MLFLOW_TRACKING_URI": settings.mlflow_tracking_uri}
    env.pop("RAY_ADDRESS", None)
    argv = [str(UPSCALE), "serve", "--host", "127.0.0.1", "--port", str(port), *options]
    if orphan:
        started = subprocess.run(["/bin/sh", "-c", '"$@" >"$0" 2>&1 & echo $!', str(log), *argv], env=env,
                                 start_new_session=True, capture_output=True, text=True, check=True)
        proc = Orphan(int(started.stdout))
        if psutil.Process(proc.pid).ppid() != 1:
            kill(proc)
            pytest.skip("a subreaper, not PID 1, adopts orphaned processes here")
    else:
        proc = subprocess.Popen(argv, env=env, start_new_session=True, stdout=log.open("w"),
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(url), 240, "the server to answer", proc, log)
        yield url, proc
    finally:
        kill(proc)


def kill(proc: subprocess.Popen | Orphan) -> None:
    """SIGKILL the server and everything in its process group (embedded Ray included), as a crash would."""
    with suppress(ProcessLookupError):
        os.killpg(os.getpgid(proc.pid), signal.SIGKILL)
    proc.wait(30)


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for(fn: Callable[[], object], timeout_s: float, what: str, proc: subprocess.Popen, log: Path):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        assert proc.poll() is None, f"the server exited while waiting for {what}:\n{log.read_text()[-3000:]}"
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()[-3000:]}")


def statuses(store: Store, sweep_id: str) -> dict[str, str]:
    return {s.key: s.status for s, _ in store.members(sweep_id)}


def attempts(store: Store, keys) -> dict[str, list[tuple]]:
    return {k: [(a.number, a.owner, a.status, a.ended_at) for a in store.attempts(k)] for k in keys}


def ended(sweep: SweepRecord) -> bool:
    """Settled, and its runner gone (it lets go once it has closed the sweep's MLflow run)."""
    return sweep.status in ("done", "failed", "cancelled") and sweep.runner is None


def submit(url: str, token: str, spec: str) -> SweepRecord:
    r = httpx.post(f"{url}/sweeps", content=spec, timeout=60,
                   headers={"Authorization": f"Bearer {token}", "content-type": "application/yaml"})
    assert r.status_code in (200, 201), r.text
    return r.json()["id"]


def test_a_killed_server_restarted_finishes_its_sweep_and_its_cancelling(tmp_path, mlflow_uri) -> None:
    settings = Settings(home=tmp_path / "home", mlflow_tracking_uri=mlflow_uri)
    store = Store(settings.db_url)
    token = create_token(store, "write", "alice")
    mlflow = MlflowClient(mlflow_uri)

    # 1. a server trains the sweep; it is killed once some segments are done and some are running
    with upscale_serve(settings, tmp_path / "serve-1.log") as (url, proc):
        sweep_id = submit(url, token, SPEC)

        def mid_sweep() -> bool:
            seen = list(statuses(store, sweep_id).values())
            return seen.count("done") >= 2 and seen.count("running") >= 1

        wait_for(mid_sweep, 480, "a mid-sweep moment", proc, tmp_path / "serve-1.log")
        kill(proc)
    before = statuses(store, sweep_id)
    done_before = [k for k, s in before.items() if s == "done"]
    assert "running" in before.values() and len(done_before) < len(before)
    crashed = store.sweep(sweep_id)
    assert crashed.status == "running" and crashed.runner is not None  # left by the dead server
    kept = attempts(store, done_before)

    # 2. a new server on the same home adopts it and finishes it
    with upscale_serve(settings, tmp_path / "serve-2.log") as (url, proc):
        log = tmp_path / "serve-2.log"
        wait_for(lambda: ended(store.sweep(sweep_id)), 480, "the sweep to end", proc, log)
        finished = store.sweep(sweep_id)
        assert finished.status == "done", finished.error
        assert attempts(store, done_before) == kept  # a segment done before the kill was never touched again
        for key, tries in attempts(store, before).items():  # every segment finished exactly once
            assert [t[2] for t in tries].count("done") + [t[2] for t in tries].count("adopted") == 1, (key, tries)
        assert mlflow.get_run(finished.mlflow_run_id).info.status == "FINISHED"

        # 3. a second sweep is running when this server dies too, and is cancelled while no server runs
        second = submit(url, token, SPEC.replace("name: crash", "name: crash-cancel")
                        .replace("methods: [naive, drop]", "methods: [noise]"))
        wait_for(lambda: "running" in statuses(store, second).values(), 480, "the second sweep to train", proc, log)
        kill(proc)
    store.request_cancel(second)  # what `upscale cancel` does with the server down
    assert store.sweep(second).status == "cancelling"

    with upscale_serve(settings, tmp_path / "serve-3.log") as (url, proc):
        wait_for(lambda: ended(store.sweep(second)), 240, "the cancel to finish", proc, tmp_path / "serve-3.log")
        cancelled = store.sweep(second)
        assert cancelled.status == "cancelled", cancelled.error
        assert "running" not in statuses(store, second).values()  # released back to pending (or adopted)
        assert mlflow.get_run(cancelled.mlflow_run_id).info.status == "KILLED"
        time.sleep(2)  # a cancelled sweep stays cancelled: the loop does not resume it
        assert store.sweep(second).status == "cancelled"
