"""A sweep's progress in time (GET /sweeps/{id} `timing`, `upscale status`, `upscale submit --wait`): the plan's
estimate of what it trains, the time left at the pace measured so far, and the tokens/s its workers reached.

What a sweep trains is told apart from what it reuses by the store's attempts: a member segment is trained for it if
it is not done, or finished an attempt after the sweep was recorded; one done without such an attempt was done
before (by an earlier sweep, or taken over as stale or as another cut of its chain) and counts as neither work done
nor work left. So a sweep half of which an earlier sweep trained shows the time of its new half, and its pace is
measured on what it trains, never on segments that were instant because they were already there.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select

from upscale.control.plans import estimate_basis
from upscale.control.schemas import SweepTiming
from upscale.control.services import Services
from upscale.orchestrator.clock import as_utc, utcnow
from upscale.orchestrator.records import AttemptRecord, SegmentRecord, SweepRecord, SweepSegmentRecord
from upscale.sweeps.planner import eta_s, gpu_flops_per_s, seconds_of
from upscale.sweeps.segments import SegmentSpec
from upscale.sweeps.spec import SweepSpec

FINISHED = ("done", "adopted")  # attempts whose result the segment was recorded done with


@dataclass(frozen=True)
class _Attempt:
    key: str
    status: str
    started_at: datetime
    ended_at: datetime | None
    wall_s: float | None


def stored_seconds(seg: SegmentRecord, flops_per_s: float | None) -> float:
    """What the plan estimated of a recorded segment, from the store (its spec, FLOPs and tokens)."""
    return seconds_of(SegmentSpec.model_validate(seg.config), seg.flops, seg.tokens, seg.observation is not None,
                      flops_per_s=flops_per_s)


def timing(services: Services, sweep: SweepRecord, members: list[tuple[SegmentRecord, SweepSegmentRecord]]
           ) -> SweepTiming:
    """``sweep``'s timing from its ``members`` (`Store.members`) and one query of their attempts since it was
    recorded."""
    since, now = as_utc(sweep.created_at), utcnow()
    attempts = _attempts_since(services, sweep.id, since)
    flops_per_s = gpu_flops_per_s(SweepSpec.model_validate(sweep.spec))
    finished = {a.key: a for a in attempts if a.status in FINISHED}
    to_train = trained = reused = tokens = 0
    planned = planned_done = planned_waiting = wall = 0.0
    done_at: list[tuple[datetime, float]] = []  # (when, planned seconds) of each segment trained for it
    for seg, _ in members:
        if seg.status == "done" and seg.key not in finished:
            reused += 1
            continue
        seconds = stored_seconds(seg, flops_per_s)
        to_train += 1
        planned += seconds
        if seg.status == "done":
            trained += 1
            planned_done += seconds
            tokens += int((seg.result or {}).get("tokens") or 0)
            wall += finished[seg.key].wall_s or 0.0
            if finished[seg.key].ended_at is not None:
                done_at.append((as_utc(finished[seg.key].ended_at), seconds))
        elif seg.status != "running":
            planned_waiting += seconds
    elapsed = first = None
    if attempts:
        start = max(min(as_utc(a.started_at) for a in attempts), since)  # one another sweep began: from ours
        ends = [as_utc(a.ended_at) for a in attempts if a.ended_at is not None]
        end = max(ends) if sweep.status in ("done", "failed", "cancelled") and ends else now
        elapsed = max((end - start).total_seconds(), 0.0)
        if done_at:  # the pace is measured from the first finish on: before it, the start-up (`eta_s`)
            at = min(when for when, _ in done_at)
            first = ((at - start).total_seconds(), sum(s for when, s in done_at if when == at))
    left = 0.0 if trained == to_train else eta_s(planned, planned_done, elapsed or 0.0, planned_waiting, first)
    return SweepTiming(segments_to_train=to_train, segments_trained=trained, segments_reused=reused,
                       planned_s=planned, basis=estimate_basis(flops_per_s=flops_per_s), elapsed_s=elapsed,
                       time_left_s=left, tokens_trained=tokens, tokens_per_s=tokens / wall if wall > 0 else None,
                       as_of=now)


def _attempts_since(services: Services, sweep_id: str, since: datetime) -> list[_Attempt]:
    """The attempts on the sweep's segments still running or ended after ``since``, oldest first: compared here, not
    in SQL, as SQLite gives timestamps back naive."""
    q = (select(AttemptRecord.segment_key, AttemptRecord.status, AttemptRecord.started_at, AttemptRecord.ended_at,
                AttemptRecord.wall_s)
         .join(SweepSegmentRecord, SweepSegmentRecord.segment_key == AttemptRecord.segment_key)
         .where(SweepSegmentRecord.sweep_id == sweep_id).order_by(AttemptRecord.id))
    with services.store.engine.connect() as conn:
        rows = [_Attempt(*row) for row in conn.execute(q)]
    return [a for a in rows if a.ended_at is None or as_utc(a.ended_at) >= since]
