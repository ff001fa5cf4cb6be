"""The sweep loop heals itself, on a real embedded Ray, SQLite store and MLflow store: an iteration that raises is
retried, not fatal; a store on a disk that fills up mid-sweep, then frees, costs retries, never a segment's attempts
nor the sweep, and trains nothing twice (a worker finishing when the store fails is left to finish and adopted); a
tracking store deleted mid-sweep costs only the dashboard's history. Failures are sorted by whose they are
(orchestrator/infra.py). tests/api/test_heal.py kills the raylet of a real `upscale serve`."""

from __future__ import annotations

import errno
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import ray
from mlflow.tracking import MlflowClient
from sqlalchemy.exc import OperationalError

from tests.orchestrator.conftest import TINY_NAIVE_SPEC, TINY_SPEC
from tests.orchestrator.segment_fns import counting_segment
from tests.orchestrator.test_scheduler import ends, knobs
from upscale.control.services import Services
from upscale.control.supervised import SupervisedLoop
from upscale.control.sweep_loop import SweepLoop
from upscale.control.wiring import open_services
from upscale.orchestrator.infra import is_deterministic, is_infrastructure, node_lost
from upscale.orchestrator.records import SweepRecord
from upscale.orchestrator.settings import Settings
from upscale.orchestrator.store import Store
from upscale.sweeps.loader import load_spec
from upscale.workers.errors import WorkerError

pytestmark = pytest.mark.usefixtures("ray_session")


def wait_for(fn: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not fn():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def done_count(store: Store, sweep_id: str) -> int:
    return sum(s.status == "done" for s, _ in store.members(sweep_id))


def spent(store: Store, sweep_id: str) -> list[tuple[str, str | None]]:
    """Attempts counted as failures (the retry budget spent), with their errors."""
    return [(a.segment_key, a.error) for s, _ in store.members(sweep_id) for a in store.attempts(s.key)
            if a.status == "failed"]


def start_loop(services: Services) -> SweepLoop:
    loop = SweepLoop(services, poll_s=0.1, scheduler_poll_s=0.05, segment_fn=counting_segment)
    loop.start()
    return loop


def sweep_under_loop(settings: Settings, spec: str, step_s: float,
                     done: int) -> tuple[Services, SweepRecord, SweepLoop]:
    """Open ``settings``' services, submit ``spec`` with steps of ``step_s`` seconds and start a sweep loop on it;
    returns (services, sweep, loop) once ``done`` segments are done (the loop is stopped if they never are)."""
    services = open_services(settings)
    knobs(settings, step_s=step_s)
    sweep = services.orch.submit(load_spec(spec))
    loop = start_loop(services)
    try:
        wait_for(lambda: done_count(services.store, sweep.id) >= done, 180, "a few segments to finish")
    except BaseException:
        loop.stop()
        raise
    return services, sweep, loop


def fail_once(monkeypatch, method: str, when: Callable[[], bool] = lambda: True) -> list[tuple]:
    """Make `Store.<method>` raise a locked database's error once, the first time ``when()`` holds; the list returned
    gets that call's arguments."""
    real, failures = getattr(Store, method), []

    def failing_once(self, *args, **kwargs):
        if not failures and when():
            failures.append(args)
            raise OperationalError(method, {}, Exception("database is locked"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Store, method, failing_once)
    return failures


def test_failures_are_sorted_by_whose_they_are() -> None:
    full = OSError(errno.ENOSPC, "No space left on device")
    assert is_infrastructure(full) and not is_deterministic(full)
    assert is_infrastructure(OperationalError("INSERT", {}, Exception("database is locked")))
    assert is_infrastructure(ray.exceptions.LocalRayletDiedError())
    wrapped = RuntimeError("while saving")
    wrapped.__cause__ = full
    assert is_infrastructure(wrapped)
    assert is_deterministic(WorkerError("bad lr")) and is_deterministic(TypeError("x"))
    assert not is_infrastructure(RuntimeError("injected failure")) and not is_deterministic(RuntimeError("x"))
    # a dead node is one machine of a cluster (its task is requeued while the others answer), a dead raylet is not
    assert node_lost(ray.exceptions.NodeDiedError("17f9")) and not node_lost(ray.exceptions.LocalRayletDiedError())


def test_an_iteration_that_raises_is_retried_and_the_loop_lives_on() -> None:
    class Flaky(SupervisedLoop):
        def __init__(self) -> None:
            super().__init__("flaky", interval_s=0.01, stuck_after_s=60)
            self.calls = 0

        def tick(self) -> None:
            self.calls += 1
            if self.calls <= 2:
                raise OperationalError("UPDATE sweeps", {}, Exception("database is locked"))

    loop = Flaky()
    loop.start()
    try:
        wait_for(lambda: loop.calls >= 4, 10, "the loop to tick after two failures")
        assert loop.is_alive() and loop.failures == 0 and loop.last_error is None  # reset by a good tick
        assert loop.health()["ok"]
    finally:
        loop.stop()
        loop.join(5)
    assert loop.down() == "stopped" and not loop.health()["ok"]


def test_the_sweep_loop_survives_the_store_failing_and_still_runs_the_sweep(settings, monkeypatch) -> None:
    services = open_services(settings)
    knobs(settings)
    sweep = services.orch.submit(load_spec(TINY_NAIVE_SPEC))
    failures = fail_once(monkeypatch, "sweeps")
    loop = start_loop(services)
    try:
        wait_for(lambda: services.store.sweep(sweep.id).status == "done", 180, "the sweep to finish")
        assert failures and loop.is_alive() and loop.health()["ok"]
    finally:
        loop.stop()


@pytest.mark.slow  # ~14 s on 2 busy cores (make test stays under 10 minutes)
def test_a_store_failing_while_a_worker_finishes_leaves_the_worker_to_finish_and_trains_nothing_twice(
        settings, monkeypatch) -> None:
    """The store fails while a worker is between its last step and its result file: the scheduler that stops leaves
    the worker running and the next one adopts its result. Killing it there would train the segment again."""
    services = open_services(settings)
    knobs(settings, linger_s=1.5)
    sweep = services.orch.submit(load_spec(TINY_NAIVE_SPEC))
    failures = fail_once(monkeypatch, "poll", when=lambda: bool(ends(settings)))  # a worker lingers after its end
    loop = start_loop(services)
    try:
        wait_for(lambda: services.store.sweep(sweep.id).status == "done", 180, "the sweep to finish")
    finally:
        loop.stop()
    assert failures
    assert spent(services.store, sweep.id) == []
    trained = ends(settings)
    assert set(trained) == {s.key for s, _ in services.store.members(sweep.id) if s.reused_from is None}
    assert max(trained.values()) == 1, trained  # the lingering worker's segment was adopted, not trained again


@pytest.fixture
def small_disk(tmp_path) -> Path:
    """A real 16 MiB tmpfs (the test needs root to mount it)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=True)


def fill(disk: Path) -> Path:
    """Write a file until the disk has no byte left."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        for chunk in (1 << 20, 4096, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC
    return filler


@pytest.mark.slow  # ~15 s
def test_a_store_whose_disk_fills_mid_sweep_then_frees_finishes_the_sweep_training_nothing_twice(
        tmp_path, small_disk, mlflow_uri) -> None:
    # the store on the small disk, the checkpoints (and the test segments' event log) beside it
    settings = Settings(home=small_disk, checkpoint_dir=str(tmp_path / "checkpoints"), mlflow_tracking_uri=mlflow_uri)
    services, sweep, loop = sweep_under_loop(settings, TINY_SPEC, step_s=0.02, done=3)
    store = services.store
    try:
        filler = fill(small_disk)
        wait_for(lambda: loop.failures >= 1, 180, "the full disk to fail the store")
        assert loop.is_alive() and "full" in loop.last_error
        assert store.sweep(sweep.id).status in ("running", "pending")  # not failed, not cancelled
        filler.unlink()
        wait_for(lambda: store.sweep(sweep.id).status == "done", 300, "the sweep to finish once the disk frees")
        assert loop.is_alive() and loop.failures == 0
    finally:
        loop.stop()
    members = [s for s, _ in store.members(sweep.id)]
    assert all(s.status == "done" for s in members)
    assert spent(store, sweep.id) == []  # the full disk spent no attempt
    trained = ends(settings)
    assert set(trained) == {s.key for s in members if s.reused_from is None}
    assert max(trained.values()) == 1, trained  # nothing trained twice


@pytest.mark.slow  # ~10 s on 2 busy cores (make test stays under 10 minutes)
def test_a_tracking_store_deleted_mid_sweep_costs_only_the_dashboard(tmp_path) -> None:
    mlflow_db = tmp_path / "mlflow" / "mlflow.db"
    mlflow_db.parent.mkdir()
    settings = Settings(home=tmp_path / "home", mlflow_tracking_uri=f"sqlite:///{mlflow_db}")
    services, sweep, loop = sweep_under_loop(settings, TINY_SPEC, step_s=0.02, done=3)
    store = services.store
    try:
        mlflow_db.unlink()
        wait_for(lambda: store.sweep(sweep.id).status == "done", 300, "the sweep to finish without its MLflow store")
        assert spent(store, sweep.id) == []
        # a later sweep of old segments only (it trains nothing) finishes too, its run made in a new tracking store
        again = services.orch.submit(load_spec(TINY_NAIVE_SPEC))
        wait_for(lambda: store.sweep(again.id).status == "done", 180, "the sweep of old segments to finish")
    finally:
        loop.stop()
    assert max(ends(settings).values()) == 1
    assert mlflow_db.exists()  # made anew, with the runs of what ran since
    later = store.sweep(again.id)
    assert later.mlflow_run_id is not None, later
    run = MlflowClient(settings.mlflow_tracking_uri).get_run(later.mlflow_run_id)
    assert run.info.status == "FINISHED", run.info


@pytest.mark.slow  # ~11 s on 2 busy cores (make test stays under 10 minutes)
def test_stopping_the_loop_mid_sweep_leaves_it_pending_and_the_next_loop_finishes_it(settings) -> None:
    services, sweep, loop = sweep_under_loop(settings, TINY_NAIVE_SPEC, step_s=0.05, done=2)
    store = services.store
    loop.stop()  # what the server's shutdown (SIGTERM) does
    stopped = store.sweep(sweep.id)
    assert stopped.status == "pending" and stopped.runner is None, stopped  # nobody cancelled it
    assert "the server stopped" in stopped.error
    assert not any(s.status == "running" for s, _ in store.members(sweep.id))  # released, nothing left running
    loop = start_loop(services)
    try:
        wait_for(lambda: store.sweep(sweep.id).status == "done", 300, "the next loop to finish the sweep")
    finally:
        loop.stop()
    assert spent(store, sweep.id) == [] and max(ends(settings).values()) == 1
