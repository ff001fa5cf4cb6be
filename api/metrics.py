"""`GET /metrics`: Prometheus text gauges read from the store at scrape time (no counters to lose on restart)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from sqlalchemy import func, select

from upscale.control import refits
from upscale.control.services import Services
from upscale.orchestrator.records import SegmentRecord, SweepRecord

STATES = ("pending", "running", "done", "failed")


def render(services: Services) -> bytes:
    registry = CollectorRegistry()
    segments = Gauge("upscale_segments", "Segments in the store by state.", ["state"], registry=registry)
    queue = Gauge("upscale_queue_length", "Sweeps waiting for the scheduler (status pending).", registry=registry)
    lag = Gauge("upscale_refit_age_seconds", "Per active refit schedule: seconds since its sweeps first had an "
                "observation its latest version has not seen (how long its refits lag behind their inputs); 0 while "
                "that version has them all, however long nothing new arrives.", ["schedule"], registry=registry)
    with services.store.transaction() as s:
        counts = dict(s.execute(select(SegmentRecord.status, func.count()).group_by(SegmentRecord.status)).all())
        waiting = s.scalar(select(func.count()).select_from(SweepRecord).where(SweepRecord.status == "pending"))
    for state in STATES:
        segments.labels(state).set(counts.get(state, 0))
    queue.set(waiting or 0)
    for schedule_id, seconds in refits.lag_s(services).items():
        lag.labels(schedule_id).set(seconds)
    return generate_latest(registry)
