"""State changes that race each other end in one state that matches what happened, on SQLite and on PostgreSQL:
identical submissions from many threads at once make one sweep, and a cancel interleaved with a scheduler's claim,
start or completion never turns a finished sweep cancelled nor lets a claimed one train while it shows cancelled.

Strategy: the real control functions and store on a real SQLite file and (marked postgres) a real PostgreSQL server,
each test from an empty schema (tests/orchestrator/test_store.py's `store` fixture). Submissions start together behind
a barrier; each interleaving of cancel with the scheduler's own writes is played step by step, then raced from
threads. One test runs the real scheduler (embedded Ray, the counting segment function) on a claimed sweep whose
cancel came before it started: nothing trains."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.orchestrator.conftest import TINY_SPEC
from tests.orchestrator.segment_fns import counting_segment
from tests.orchestrator.test_scheduler import events
from tests.orchestrator.test_store import store  # noqa: F401  (the fixture: SQLite, and PostgreSQL when configured)
from upscale.control import sweeps
from upscale.control.records import SweepOwnerRecord
from upscale.control.services import Services
from upscale.control.wiring import open_services
from upscale.orchestrator.scheduler import Scheduler
from upscale.orchestrator.settings import Settings
from upscale.orchestrator.store import Store
from upscale.sweeps.loader import load_spec
from upscale.sweeps.planner import plan

THREADS = 16


@pytest.fixture
def services(store: Store, tmp_path, mlflow_uri) -> Services:  # noqa: F811
    return open_services(Settings(home=tmp_path, db_url=store.url, mlflow_tracking_uri=mlflow_uri))


def recorded(into: Store) -> str:
    """The tiny sweep recorded as pending, as a submission leaves it."""
    spec = load_spec(TINY_SPEC)
    return into.create_sweep(spec.name, spec.model_dump(mode="json"), spec.resources.model_dump(mode="json"),
                              plan(spec).segments).id


def test_sixteen_concurrent_identical_submissions_make_one_sweep(services: Services) -> None:
    spec = load_spec(TINY_SPEC)
    start = threading.Barrier(THREADS)

    def submit(owner: str):
        start.wait()
        return sweeps.submit(services, spec, owner)

    with ThreadPoolExecutor(THREADS) as pool:
        answers = list(pool.map(submit, ["alice"] * (THREADS - 1) + ["bob"]))
    alices = [a for a in answers if a.owner == "alice"]
    assert len({a.id for a in alices}) == 1  # one sweep for alice's fifteen identical submissions
    assert [a.existing for a in alices].count(False) == 1  # one of them recorded it, the others were given it
    assert answers[-1].id != alices[0].id  # bob's identical spec is bob's own sweep
    assert len(services.store.sweeps()) == 2
    with services.store.transaction() as s:  # each written with its owner, in the same transaction
        owners = {r.sweep_id: r.owner for r in s.query(SweepOwnerRecord)}
    assert owners == {alices[0].id: "alice", answers[-1].id: "bob"}
    assert sweeps.submit(services, spec, "alice", new=True).id not in owners  # `new` still asks for another


@pytest.mark.parametrize("ended", ["done", "failed", "cancelled"])
def test_a_cancel_after_the_sweep_ended_leaves_it_as_it_ended(store: Store, ended: str) -> None:  # noqa: F811
    sweep_id = recorded(store)
    store.set_sweep(sweep_id, status=ended)
    store.request_cancel(sweep_id)
    assert store.sweep(sweep_id).status == ended


def test_a_pending_sweep_no_scheduler_claimed_is_cancelled_and_then_cannot_be_claimed(store: Store) -> None:  # noqa: F811
    sweep_id = recorded(store)
    as_read = store.sweep(sweep_id)  # what a sweep loop read just before the cancel
    store.request_cancel(sweep_id)
    assert store.sweep(sweep_id).status == "cancelled"
    assert not store.claim_sweep(as_read, "host:1:a")  # the claim's compare-and-set sees the cancel
    assert store.sweep(sweep_id).runner is None


def test_a_claimed_sweep_cancelled_before_it_starts_stays_cancelling(store: Store) -> None:  # noqa: F811
    sweep_id = recorded(store)
    assert store.claim_sweep(store.sweep(sweep_id), "host:1:a")
    store.request_cancel(sweep_id)
    assert store.sweep(sweep_id).status == "cancelling"  # its scheduler is told, not bypassed
    assert not store.start_sweep(sweep_id)  # the scheduler's start does not overwrite it
    assert store.sweep(sweep_id).status == "cancelling"


def test_a_sweep_completing_while_cancels_race_it_ends_done(store: Store) -> None:  # noqa: F811
    for _ in range(5):
        sweep_id = recorded(store)
        assert store.claim_sweep(store.sweep(sweep_id), "host:1:a") and store.start_sweep(sweep_id)
        start = threading.Barrier(THREADS)

        def race(i: int, start: threading.Barrier = start, sweep_id: str = sweep_id) -> None:
            start.wait()
            if i == 0:
                store.set_sweep(sweep_id, status="done")  # the scheduler's last write: every segment trained
            else:
                store.request_cancel(sweep_id)

        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(race, range(THREADS)))
        # cancels before the completion made it cancelling, which the completion ends; any after it changed nothing
        assert store.sweep(sweep_id).status == "done"


@pytest.mark.usefixtures("ray_session")
def test_the_scheduler_of_a_claimed_sweep_cancelled_before_it_started_trains_nothing(settings) -> None:
    services = open_services(settings)
    sweep_id = recorded(services.store)
    scheduler = Scheduler(services.store, settings, segment_fn=counting_segment, poll_s=0.05)
    assert services.store.claim_sweep(services.store.sweep(sweep_id), scheduler.owner)
    services.store.request_cancel(sweep_id)
    out = scheduler.run(sweep_id)
    assert out.status == "cancelled" and services.store.sweep(sweep_id).status == "cancelled"
    assert events(settings) == []  # no segment started
