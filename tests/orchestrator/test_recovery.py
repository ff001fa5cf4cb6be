"""What makes a crashed scheduler's work recoverable, on a real embedded Ray, SQLite store and MLflow store: a
worker killed mid-segment is one failed attempt in the store (Ray retries nothing behind its back), a sweep's runner
is claimed by exactly one scheduler, a sweep left cancelling by a dead runner finishes cancelling, and a sweep the
cluster cannot run waits without blocking the ones behind it.

The sweep loop here is the one `upscale serve` runs (control/sweep_loop.py), driven one step at a time (`run_next`)
with the test segment function (segment_fns.py); tests/api/test_recovery.py kills a real `upscale serve`."""

from __future__ import annotations

import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.orchestrator.conftest import TINY_SPEC
from tests.orchestrator.segment_fns import counting_segment
from tests.orchestrator.test_scheduler import ends, knobs, scheduler
from upscale.control.sweep_loop import SweepLoop
from upscale.control.wiring import open_services
from upscale.orchestrator.clock import utcnow
from upscale.orchestrator.scheduler import owner_id, runner_gone
from upscale.orchestrator.service import Orchestrator
from upscale.orchestrator.tracking import RunTree
from upscale.sweeps.loader import load_spec
from upscale.sweeps.planner import plan

pytestmark = pytest.mark.usefixtures("ray_session")

SMALL_SPEC = """
name: small
model: {sizes: [nano]}
moe: {experts: [2], topk: [1]}
upcycling: {methods: [naive]}
tokens: {d1: [256], d2: [128]}
train: {context: 16, batch_size: 4, lr: {dense: 3.0e-3, moe: 2.0e-3}, warmup_tokens: 64}
resources: {cpus: 1}
"""


def dead_owner() -> str:
    """host:pid:nonce of a process on this host that has exited."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return f"{socket.gethostname()}:{int(proc.stdout)}:dead00"


def test_a_killed_worker_is_one_failed_attempt_that_the_scheduler_retries(settings) -> None:
    orch = Orchestrator.open(settings)
    spec = load_spec(TINY_SPEC)
    trunk = next(s for s in plan(spec).segments if s.spec.kind == "dense_trunk")
    knobs(settings)
    (Path(settings.checkpoint_dir) / f"fail-{trunk.id}").write_text("die")  # SIGKILLs its worker half-way, once
    out = orch.run(spec, scheduler(orch, checkpoint_every_tokens=64))
    assert out.status == "done" and out.retried == 1
    attempts = orch.store.attempts(trunk.id)
    assert [a.status for a in attempts] == ["failed", "done"]  # a Ray-level retry would have left only "done"
    assert "WorkerCrashedError" in attempts[0].error
    assert ends(settings)[trunk.id] == 1


def test_one_of_two_schedulers_claims_an_orphaned_sweep(settings) -> None:
    store = Orchestrator.open(settings).store
    sweep = store.create_sweep("s", {}, {"cpus": 1}, [])
    store.set_sweep(sweep.id, status="running", runner="elsewhere:1:abc",
                    runner_heartbeat_at=utcnow() - timedelta(hours=1))
    seen = store.sweep(sweep.id)
    assert runner_gone(seen)
    first, second = owner_id(), owner_id()
    assert store.claim_sweep(seen, first) and not store.claim_sweep(seen, second)
    mine = store.sweep(sweep.id)
    assert mine.runner == first and not runner_gone(mine)  # this process is alive
    store.release_sweep(sweep.id, second)  # not the runner: changes nothing
    assert store.sweep(sweep.id).runner == first
    store.release_sweep(sweep.id, first)
    assert store.sweep(sweep.id).runner is None


def test_a_sweep_without_a_runner_is_orphaned_only_once_stale(settings) -> None:
    store = Orchestrator.open(settings).store
    sweep = store.create_sweep("s", {}, {"cpus": 1}, [])
    store.set_sweep(sweep.id, status="running")
    assert not runner_gone(store.sweep(sweep.id))  # just updated: its runner (from before runners) may be alive
    assert runner_gone(store.sweep(sweep.id), stale_after_s=0)
    store.set_sweep(sweep.id, runner="elsewhere:1:abc", runner_heartbeat_at=utcnow())
    assert not runner_gone(store.sweep(sweep.id))  # another host's runner with a fresh heartbeat


def test_a_sweep_left_cancelling_by_a_dead_runner_ends_cancelled(settings) -> None:
    services = open_services(settings)
    store = services.store
    spec = load_spec(TINY_SPEC)
    sweep = services.orch.submit(spec)
    tracker = RunTree.for_settings(settings)
    parent = tracker.start_sweep(sweep.id, sweep.name, sweep.spec)
    dead = dead_owner()
    trunk = next(s for s in plan(spec).segments if s.spec.kind == "dense_trunk")
    attempt = store.claim(trunk.id, dead)  # the dead runner was training the trunk
    run = tracker.start_segment(parent, sweep.id, trunk.id, trunk.spec, {})
    store.set_segment_run(trunk.id, run)
    store.set_sweep(sweep.id, mlflow_run_id=parent, status="cancelling", runner=dead, runner_heartbeat_at=utcnow())
    assert SweepLoop(services, segment_fn=counting_segment).run_next()
    after = store.sweep(sweep.id)
    assert after.status == "cancelled" and after.runner is None
    assert store.segment(trunk.id).status == "pending"
    assert [a.status for a in store.attempts(trunk.id)] == ["orphaned"] and attempt.number == 1
    client = MlflowClient(settings.mlflow_tracking_uri)
    assert client.get_run(parent).info.status == "KILLED" and client.get_run(run).info.status == "KILLED"
    assert not ends(settings)  # cancelling trains nothing


def test_a_sweep_waiting_for_resources_does_not_block_the_next(settings) -> None:
    services = open_services(settings)
    store = services.store
    knobs(settings)
    # recorded without the submit check, as a sweep submitted before the cluster shrank would be
    big = services.orch.submit(load_spec(TINY_SPEC.replace("resources: {cpus: 1}", "resources: {cpus: 64}")))
    small = services.orch.submit(load_spec(SMALL_SPEC))
    loop = SweepLoop(services, segment_fn=counting_segment, scheduler_poll_s=0.05)
    assert loop.run_next()
    assert store.sweep(small.id).status == "done"
    waiting = store.sweep(big.id)
    assert waiting.status == "pending" and waiting.runner is None
    assert waiting.error == ("waiting for resources: resources.cpus: a segment needs 64 cpus (64 x 1 workers); "
                             "the cluster has 2")
    assert not loop.run_next()  # nothing else it can run: it leaves the big one waiting
    assert store.sweep(big.id).status == "pending"
