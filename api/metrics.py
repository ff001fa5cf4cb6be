"""`GET /metrics`: Prometheus text gauges read from the store at scrape time (no counters to lose on restart)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from sqlalchemy import func, select

from upscale.control.records import RefitRecord
from upscale.control.services import Services
from upscale.orchestrator.records import SegmentRecord, SweepRecord, as_utc, utcnow

STATES = ("pending", "running", "done", "failed")


def render(services: Services) -> bytes:
    registry = CollectorRegistry()
    segments = Gauge("upscale_segments", "Segments in the store by state.", ["state"], registry=registry)
    queue = Gauge("upscale_queue_length", "Sweeps waiting for the scheduler (status pending).", registry=registry)
    age = Gauge("upscale_refit_age_seconds", "Seconds since the latest refit record; NaN before the first.",
                registry=registry)
    with services.store.transaction() as s:
        counts = dict(s.execute(select(SegmentRecord.status, func.count()).group_by(SegmentRecord.status)).all())
        waiting = s.scalar(select(func.count()).select_from(SweepRecord).where(SweepRecord.status == "pending"))
        last = s.scalar(select(func.max(RefitRecord.created_at)))
    for state in STATES:
        segments.labels(state).set(counts.get(state, 0))
    queue.set(waiting or 0)
    if last is not None:
        age.set((utcnow() - as_utc(last)).total_seconds())
    else:
        age.set(float("nan"))
    return generate_latest(registry)
