"""Refit schedules and their immutable, versioned refit records, plus the thread that fires them.

A refit fits one law per kind on the schedule's sweeps (api/fits.py), computes D* at N1 when both a scratch and
an upcycled law are fitted, and records version n+1 with the hash of its inputs (request + observation table),
its diff from version n, and `left_interval` when D* falls outside version n's interval. `on_new_observations`
schedules fire when that hash changes; `cron` schedules fire once in each matching minute.
"""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from datetime import datetime

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from upscale.api.cron import fires_at
from upscale.api.fits import ObservationCache, create_fit, fitted, observations_table
from upscale.api.records import FitRecord, RefitRecord, RefitScheduleRecord
from upscale.api.schemas import FitCreate, RefitRequest, RefitScheduleCreate
from upscale.api.services import Services
from upscale.fitting.dstar import dstar_at
from upscale.fitting.errors import FitError
from upscale.orchestrator.errors import OrchestratorError
from upscale.orchestrator.records import utcnow


def create_schedule(services: Services, body: RefitScheduleCreate, owner: str) -> RefitScheduleRecord:
    for sweep_id in body.request.sweep_ids:
        services.store.sweep(sweep_id)  # OrchestratorError if unknown
    record = RefitScheduleRecord(id=uuid.uuid4().hex[:12], name=body.name, trigger=body.trigger, cron=body.cron,
                                 request=body.request.model_dump(mode="json"), owner=owner, active=True)
    with services.store.transaction() as s:
        s.add(record)
    return record


def schedules(services: Services, active_only: bool = True) -> list[RefitScheduleRecord]:
    with services.store.transaction() as s:
        q = select(RefitScheduleRecord).order_by(RefitScheduleRecord.created_at)
        return list(s.scalars(q.where(RefitScheduleRecord.active) if active_only else q))


def get_schedule(services: Services, schedule_id: str) -> RefitScheduleRecord | None:
    with services.store.transaction() as s:
        return s.get(RefitScheduleRecord, schedule_id)


def deactivate(services: Services, schedule_id: str) -> None:
    """Stop a schedule; its refit records stay (they are history, never deleted)."""
    with services.store.transaction() as s:
        s.get(RefitScheduleRecord, schedule_id).active = False


def refits(services: Services, schedule_id: str | None = None) -> list[RefitRecord]:
    with services.store.transaction() as s:
        q = select(RefitRecord).order_by(RefitRecord.schedule_id, RefitRecord.version)
        return list(s.scalars(q.where(RefitRecord.schedule_id == schedule_id) if schedule_id else q))


def inputs_hash(services: Services, req: RefitRequest, cache: ObservationCache | None = None) -> str:
    """sha256 of the request and of every observation table it would fit."""
    h = hashlib.sha256(json.dumps(req.model_dump(mode="json"), sort_keys=True).encode())
    for kind in sorted(req.laws):
        h.update(observations_table(services, req.sweep_ids, kind, cache).to_csv(index=False).encode())
    return h.hexdigest()


def _diff(s: Session, old: RefitRecord | None, params: dict[str, dict[str, float]], dstar: float | None) -> dict:
    """New minus old, per kind per parameter, and for D*; empty for version 1."""
    if old is None:
        return {}
    out: dict = {}
    for kind, fit_id in old.fits.items():
        before = s.get(FitRecord, fit_id).report["params"]
        if kind in params:
            out[kind] = {k: v - before[k] for k, v in params[kind].items() if k in before and v is not None
                         and before[k] is not None}
    if dstar is not None and old.dstar is not None:
        out["dstar"] = dstar - old.dstar
    return out


def run_refit(services: Services, schedule: RefitScheduleRecord, force: bool = False,
              cache: ObservationCache | None = None) -> RefitRecord | None:
    """Refit now; None when the inputs are those last tried and not ``force``. FitError if a fit fails.

    ``cache`` (one refit tick's) shares observation reads between schedules; the fits then use the very tables
    that were hashed."""
    req = RefitRequest.model_validate(schedule.request)
    cache = cache if cache is not None else ObservationCache(services)
    digest = inputs_hash(services, req, cache)
    with services.store.transaction() as s:  # a conditional UPDATE: of racing loops, one fires on new inputs
        mark = update(RefitScheduleRecord).where(RefitScheduleRecord.id == schedule.id).values(last_checked_hash=digest)
        if not force:
            mark = mark.where(or_(RefitScheduleRecord.last_checked_hash.is_(None),
                                  RefitScheduleRecord.last_checked_hash != digest))
        if s.execute(mark).rowcount == 0:
            return None
    schedule.last_checked_hash = digest
    fit_ids, params = {}, {}
    for kind, law in sorted(req.laws.items()):
        record = create_fit(services, FitCreate(law=law, kind=kind, sweep_ids=req.sweep_ids, fixed=req.fixed,
                                                bootstrap=req.bootstrap), schedule.owner, cache)
        fit_ids[kind], params[kind] = record.id, record.report["params"]
    dstar, ci = None, None
    if {"scratch", "upcycled"} <= set(fit_ids):
        star = dstar_at(fitted(services, fit_ids["scratch"]), fitted(services, fit_ids["upcycled"]), req.n1)
        dstar, ci = star["dstar"], star["ci"]
    with services.store.transaction() as s:
        prev = s.scalar(select(RefitRecord).where(RefitRecord.schedule_id == schedule.id)
                        .order_by(RefitRecord.version.desc()).limit(1))
        diff = _diff(s, prev, params, dstar)
        left = bool(prev and prev.dstar_ci and dstar is not None and None not in prev.dstar_ci
                    and not prev.dstar_ci[0] <= dstar <= prev.dstar_ci[1])
        record = RefitRecord(schedule_id=schedule.id, version=(prev.version if prev else 0) + 1, inputs_hash=digest,
                             fits=fit_ids, dstar=dstar, dstar_ci=ci, diff=diff, left_interval=left)
        s.add(record)
        s.get(RefitScheduleRecord, schedule.id).last_error = None
    return record


def fail(services: Services, schedule_id: str, error: str) -> None:
    with services.store.transaction() as s:
        s.get(RefitScheduleRecord, schedule_id).last_error = error[:2000]


def claim_minute(services: Services, schedule_id: str, minute: datetime) -> bool:
    """Claim a cron schedule's `minute` for this loop: one conditional UPDATE, so of several loops (serve and
    scheduler processes, replicas) watching the same schedules exactly one fires it."""
    with services.store.transaction() as s:
        claimed = s.execute(
            update(RefitScheduleRecord)
            .where(RefitScheduleRecord.id == schedule_id,
                   or_(RefitScheduleRecord.last_fired_minute.is_(None),
                       RefitScheduleRecord.last_fired_minute < minute))
            .values(last_fired_minute=minute))
    return claimed.rowcount == 1


class RefitLoop(threading.Thread):
    """Fires due schedules every ``tick_s``; a failing refit is noted on its schedule, never fatal to the loop."""

    def __init__(self, services: Services, tick_s: float = 5.0) -> None:
        super().__init__(name="upscale-refits", daemon=True)
        self.services, self.tick_s = services, tick_s
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(self.tick_s):
            self.tick()

    def tick(self) -> None:
        now = utcnow().replace(second=0, microsecond=0)
        cache = ObservationCache(self.services)  # each sweep's observations are read once per tick
        for schedule in schedules(self.services):
            if self.stopping.is_set():
                return
            if schedule.trigger == "cron" and not (fires_at(schedule.cron or "", now)
                                                   and claim_minute(self.services, schedule.id, now)):
                continue
            try:
                run_refit(self.services, schedule, force=schedule.trigger == "cron", cache=cache)
            except (FitError, OrchestratorError, ValueError) as e:
                fail(self.services, schedule.id, str(e))

    def stop(self) -> None:
        self.stopping.set()
