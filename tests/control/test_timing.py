"""A sweep's timing (GET /sweeps/{id} `timing`) counts only what it trains: a sweep half of which an earlier sweep
trained shows the plan's time for its new half, a time left that is never 0 while segments remain, and a pace and
tokens/s measured on the segments it trained. Real store, embedded Ray and the real scheduler; the counting segment
function (tests/orchestrator/segment_fns.py) stands in for training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import select

from tests.orchestrator.conftest import TINY_NAIVE_SPEC, TINY_SPEC
from tests.orchestrator.segment_fns import counting_segment
from upscale.control import sweeps
from upscale.control.wiring import open_services
from upscale.orchestrator.clock import as_utc
from upscale.orchestrator.records import AttemptRecord
from upscale.orchestrator.scheduler import Scheduler
from upscale.sweeps.loader import load_spec
from upscale.sweeps.planner import eta_s, plan, segment_seconds

pytestmark = pytest.mark.usefixtures("ray_session")


def test_a_sweep_half_done_by_an_earlier_one_times_only_its_new_half(settings) -> None:
    services = open_services(settings)
    Scheduler(services.store, settings, segment_fn=counting_segment, poll_s=0.05).run(
        sweeps.submit(services, load_spec(TINY_NAIVE_SPEC), "alice").id)
    spec = load_spec(TINY_SPEC)
    created = sweeps.submit(services, spec, "alice")
    seconds = segment_seconds(plan(spec))
    done_before = {s.id for s in plan(load_spec(TINY_NAIVE_SPEC)).segments}
    new_half = sum(v for k, v in seconds.items() if k not in done_before)
    assert 0 < len(done_before) < len(seconds)

    t = sweeps.detail(services, created.id).timing
    assert (t.segments_reused, t.segments_to_train, t.segments_trained) == (
        len(done_before), len(seconds) - len(done_before), 0)
    # the plan's time for what trains, as POST /sweeps said it: not the whole grid's
    assert t.planned_s == pytest.approx(new_half) == pytest.approx(created.plan.estimate.serial_s)
    assert t.planned_s < sum(seconds.values())
    assert t.elapsed_s is None and t.time_left_s == pytest.approx(new_half)  # queued: the plan's figure, whole
    assert t.tokens_trained == 0 and t.tokens_per_s is None

    # Slow steps, so the sweep is seen between its first new segment's end and its last one's.
    root = Path(settings.checkpoint_dir)
    root.mkdir(parents=True, exist_ok=True)
    (root / "knobs.json").write_text(json.dumps({"step_s": 0.02}))
    seen = []

    def look(p) -> None:
        if p.total and len(done_before) < p.done < p.total and not seen:
            seen.append(sweeps.detail(services, created.id))

    Scheduler(services.store, settings, segment_fn=counting_segment, poll_s=0.05, on_progress=look).run(created.id)
    (mid,) = seen
    t = mid.timing
    assert 0 < t.segments_trained < t.segments_to_train and t.segments_reused == len(done_before)
    # The reused half is no progress: the pace is the new segments' planned seconds over the time they took, from
    # the first of them to finish on (the wait for it holds the start-up).
    new = [s for s in mid.segments if s.key not in done_before]
    planned_done = sum(seconds[s.key] for s in new if s.status == "done")
    waiting = sum(seconds[s.key] for s in new if s.status == "pending")
    assert t.elapsed_s is not None and t.elapsed_s > 0
    with services.store.transaction() as s:
        ended = {key: as_utc(when) for key, when in s.execute(
            select(AttemptRecord.segment_key, AttemptRecord.ended_at)
            .where(AttemptRecord.segment_key.in_([g.key for g in new if g.status == "done"]),
                   AttemptRecord.status == "done"))}
    at = min(ended.values())
    first = ((at - as_utc(t.as_of)).total_seconds() + t.elapsed_s, sum(seconds[k] for k, w in ended.items() if w == at))
    assert t.time_left_s == pytest.approx(eta_s(new_half, planned_done, t.elapsed_s, waiting, first))
    assert t.time_left_s > 0

    end = sweeps.detail(services, created.id).timing
    assert end.segments_trained == end.segments_to_train == len(seconds) - len(done_before)
    assert end.time_left_s == 0.0 and end.elapsed_s is not None and end.elapsed_s > 0
    assert end.tokens_trained == created.plan.new_tokens  # the new half's tokens, none of the reused half's
    assert end.tokens_per_s is not None and end.tokens_per_s > 0
