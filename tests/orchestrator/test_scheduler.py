"""The scheduler's state machine on a real embedded Ray (2 CPUs), a real SQLite store and a real MLflow store.

Strategy: the segment function is `segment_fns.counting_segment`, a real function with run_segment's contract
that logs every start and finish to events.jsonl; tests count those events. "Trained once" means exactly one
`end` event per segment, however many starts (resumes) it took."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.orchestrator.conftest import TINY_SPEC
from tests.orchestrator.segment_fns import counting_segment, loss_of
from upscale.orchestrator.scheduler import Scheduler
from upscale.orchestrator.service import Orchestrator
from upscale.sweeps.loader import load_spec
from upscale.sweeps.planner import plan
from upscale.sweeps.segments import SegmentSpec

pytestmark = pytest.mark.usefixtures("ray_session")


def events(settings) -> list[dict]:
    path = Path(settings.checkpoint_dir) / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def ends(settings) -> Counter:
    return Counter(e["segment"] for e in events(settings) if e["event"] == "end")


def knobs(settings, **values) -> None:
    root = Path(settings.checkpoint_dir)
    root.mkdir(parents=True, exist_ok=True)
    (root / "knobs.json").write_text(json.dumps(values))


def scheduler(orch: Orchestrator, **kw) -> Scheduler:
    return Scheduler(orch.store, orch.settings, segment_fn=counting_segment, poll_s=0.05, **kw)


def test_a_sweep_trains_every_segment_once_and_records_observations_and_runs(settings) -> None:
    orch = Orchestrator.open(settings)
    spec = load_spec(TINY_SPEC)
    out = orch.run(spec, scheduler(orch))
    p = plan(spec)
    assert out.status == "done" and sorted(out.trained) == sorted(s.id for s in p.segments)
    assert ends(settings) == Counter({s.id: 1 for s in p.segments})
    obs = orch.store.observations(out.sweep_id)
    assert Counter(o.kind for o in obs) == {"dense": 2, "upcycled": 8, "scratch": 1}
    by_key = {s.id: s for s in p.segments}
    for o in obs:
        assert o.loss == pytest.approx(loss_of(by_key[o.segment_key].spec), abs=1e-12)
        assert o.trunk == by_key[o.segment_key].trunk
    # MLflow: one parent run, one child per segment under it, its config and axes as params (sweeps/run_tags.py)
    client = MlflowClient(settings.mlflow_tracking_uri)
    sweep = orch.store.sweep(out.sweep_id)
    parent = client.get_run(sweep.mlflow_run_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["upscale.sweep_id"] == out.sweep_id
    assert parent.info.run_name.startswith("tiny (") and parent.data.params["model.sizes"] == "['nano']"
    children = client.search_runs([client.get_experiment_by_name("upscale").experiment_id],
                                  f"tags.mlflow.parentRunId = '{sweep.mlflow_run_id}'", max_results=100)
    assert len(children) == len(p.segments) == 26 and all(r.info.status == "FINISHED" for r in children)
    o = next(o for o in obs if o.kind == "upcycled" and o.method == "drop" and o.D1 == 512 and o.D2 == 256)
    run = client.get_run(o.mlflow_run_id)
    assert run.info.run_name == "upcycled drop r=0.5 4x1 · nano N1 32.9k · D1 512 · D2 256 · decay"
    assert {k: run.data.params[k] for k in ("kind", "size", "method", "r", "n_expert", "topk", "D1", "D2")} == {
        "kind": "moe_decay", "size": "nano", "method": "drop", "r": "0.5", "n_expert": "4", "topk": "1",
        "D1": "512", "D2": "256"}
    assert run.data.params["lr"] == "0.002" and run.data.params["N1"] == str(o.N1)
    assert run.data.metrics["summary/val_loss"] == pytest.approx(o.loss)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "summary/val_loss")] == [256]  # tokens seen
    # tags only for ids and state
    assert run.data.tags["upscale.segment_id"] == o.segment_key and run.data.tags["upscale.status"] == "finished"
    assert not {"upscale.kind", "upscale.method"} & set(run.data.tags)
    # its whole path as one curve over tokens since the random init: dense trunk 0-448, dense decay to 512, then
    # the upcycled MoE's trunk 0-192 and decay to 256, each 512 tokens on
    path = client.get_metric_history(run.info.run_id, "loss/path_train")
    assert [m.step for m in path] == list(range(64, 512 + 256 + 1, 64))
    moe_trunk = next(s.spec for s in p.segments if s.spec.kind == "moe_trunk" and s.axes["method"] == "drop"
                     and s.axes["D1"] == 512)
    assert next(m.value for m in path if m.step == 512 + 64) == pytest.approx(loss_of(moe_trunk) + 1 / 64)
    assert path[-1].value == client.get_metric_history(run.info.run_id, "loss/train")[-1].value
    trunk_run = next(r for r in children if r.info.run_name == "dense · nano N1 32.9k · trunk 0–448 tok")
    assert trunk_run.info.run_id in run.data.tags["mlflow.note.content"]
    assert not any(k.startswith("loss/path_") for k in trunk_run.data.metrics)  # only observations have a path


def test_an_injected_failure_is_retried_and_resumes_from_its_checkpoint(settings) -> None:
    orch = Orchestrator.open(settings)
    spec = load_spec(TINY_SPEC)
    trunk = next(s for s in plan(spec).segments if s.spec.kind == "moe_trunk")
    knobs(settings)
    (Path(settings.checkpoint_dir) / f"fail-{trunk.id}").write_text("1")
    out = orch.run(spec, scheduler(orch, checkpoint_every_tokens=64))
    assert out.status == "done" and out.retried == 1
    starts = [e["tokens"] for e in events(settings) if e["event"] == "start" and e["segment"] == trunk.id]
    assert starts == [0, 128]  # fails at 128 of the first piece's 192 tokens, resumes from the 128-token checkpoint
    assert ends(settings)[trunk.id] == 1
    assert [a.status for a in orch.store.attempts(trunk.id)] == ["failed", "done"]


def test_a_segment_failing_past_the_maximum_fails_the_sweep_and_a_rerun_finishes_it(settings) -> None:
    orch = Orchestrator.open(settings)
    spec = load_spec(TINY_SPEC)
    p = plan(spec)
    dense_decay = next(s for s in p.segments if s.spec.kind == "dense_decay")
    fail = Path(settings.checkpoint_dir) / f"fail-{dense_decay.id}"
    fail.parent.mkdir(parents=True)
    fail.write_text("2")
    out = orch.run(spec, scheduler(orch, max_attempts=2))
    assert out.status == "failed"
    sweep = orch.store.sweep(out.sweep_id)
    assert sweep.status == "failed" and dense_decay.id in sweep.error
    blocked = {s.id for s in p.segments if dense_decay.id in _ancestors(s.spec, p)}
    assert blocked and not blocked & set(ends(settings))  # nothing downstream of the failure ran
    rerun = scheduler(orch, max_attempts=2).run(out.sweep_id)
    assert rerun.status == "done" and sorted(rerun.trained) == sorted(blocked | {dense_decay.id})
    assert max(ends(settings).values()) == 1


def test_a_worker_error_is_not_retried(settings) -> None:
    orch = Orchestrator.open(settings)
    spec = load_spec(TINY_SPEC)
    scratch = next(s for s in plan(spec).segments if s.spec.kind == "scratch_trunk")
    knobs(settings)
    (Path(settings.checkpoint_dir) / f"fail-{scratch.id}").write_text("bad")
    out = orch.run(spec, scheduler(orch, max_attempts=3))
    assert out.status == "failed" and out.retried == 0
    assert [a.status for a in orch.store.attempts(scratch.id)] == ["failed"]
    assert "WorkerError: segment" in orch.store.segment(scratch.id).error
    assert len(ends(settings)) == 24  # everything but the scratch trunk and its decay
    error = orch.store.sweep(out.sweep_id).error  # its cause first, then which segments failed
    assert error.startswith(orch.store.segment(scratch.id).error) and "a bad value" in error
    assert error.endswith(f"(segment {scratch.id}; 1 segment(s) failed: {scratch.id})")


@pytest.mark.slow  # two sweeps, 36 segments: ~22 s on 2 cores
def test_an_overlapping_sweep_trains_only_its_new_segments(settings) -> None:
    orch = Orchestrator.open(settings)
    first = load_spec(TINY_SPEC)
    second = load_spec(TINY_SPEC.replace("methods: [naive, drop]", "methods: [naive, drop, noise]"))
    orch.run(first, scheduler(orch))
    out = orch.run(second, scheduler(orch))
    new = {s.id for s in plan(second).segments} - {s.id for s in plan(first).segments}
    assert len(new) == 10  # for the noise method only, per D1 (2): an upcycle, a MoE trunk's 2 pieces, 2 decays
    assert sorted(out.trained) == sorted(new)
    assert max(ends(settings).values()) == 1
    assert len(orch.store.observations(out.sweep_id)) == 11 + 4


def test_two_schedulers_on_one_sweep_train_each_segment_once(settings) -> None:
    orch = Orchestrator.open(settings)
    knobs(settings, step_s=0.005)
    sweep = orch.submit(load_spec(TINY_SPEC))
    outs = []
    threads = [threading.Thread(target=lambda: outs.append(scheduler(orch).run(sweep.id))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [o.status for o in outs] == ["done", "done"]
    assert len(outs[0].trained) + len(outs[1].trained) == 26 and not set(outs[0].trained) & set(outs[1].trained)
    assert ends(settings) == Counter({k: 1 for k in outs[0].trained + outs[1].trained})


@pytest.mark.slow  # ~35 s on 2 cores
def test_cancelling_stops_the_sweep_and_a_rerun_resumes_it(settings) -> None:
    orch = Orchestrator.open(settings)
    knobs(settings, step_s=0.05)
    sweep = orch.submit(load_spec(TINY_SPEC))
    outs = []
    thread = threading.Thread(target=lambda: outs.append(scheduler(orch, checkpoint_every_tokens=64).run(sweep.id)))
    thread.start()
    while not events(settings):
        time.sleep(0.05)
    orch.store.request_cancel(sweep.id)
    thread.join()
    assert outs[0].status == "cancelled" and orch.store.sweep(sweep.id).status == "cancelled"
    assert not any(s.status == "running" for s, _ in orch.store.members(sweep.id))
    knobs(settings)
    out = scheduler(orch, checkpoint_every_tokens=64).run(sweep.id)
    assert out.status == "done" and max(ends(settings).values()) == 1 and len(ends(settings)) == 26


def _ancestors(spec: SegmentSpec, p) -> set[str]:
    by_id = {s.id: s.spec for s in p.segments}
    out, todo = set(), list(spec.parent_ids)
    while todo:
        q = todo.pop()
        out.add(q)
        todo += by_id[q].parent_ids
    return out
