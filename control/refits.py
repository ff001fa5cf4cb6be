"""Refit schedules and their immutable, versioned refit records, plus the thread that fires them.

A refit runs the analysis on the schedule's sweeps (control/analyses.py `run_analysis`, D* at the schedule's N1, by
default the largest the sweeps trained: the one procedure, no second copy) and records version n+1 with the
analysis's id and inputs hash, D* of the upcycling group from-scratch takes longest to catch (with the analysis's
whole answer there: intervals, extrapolation, health), the diff from version n per law and parameter, and
`left_interval` when D* falls outside version n's interval. A version is recorded only when the inputs changed:
on the latest version's inputs a refit runs nothing and answers with that version. `on_new_observations` schedules
fire when the inputs hash changes (new observations, or trunk curves that move the decays the analysis predicts);
`cron` schedules fire once in each matching minute. `lag_s` (the `upscale_refit_age_seconds` metric) says how long
each schedule's latest version has lagged behind its inputs.

A schedule may name anyone's sweeps (it only reads their observations), and its analyses are its owner's alone:
their inputs hash includes the owner, decisions never answer from them, and in MLflow they are runs of their own
(control/analysis_run.py), so bob's refit of alice's sweep never replaces what alice's decisions answer from.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from upscale.control.analyses import (
    AnalysisRunning,
    analysis_params,
    curve_trunks,
    inputs_hash,
    observations_hash,
    run_analysis,
    sweep_tables,
)
from upscale.control.cron import fires_at
from upscale.control.fits import ObservationCache
from upscale.control.records import AnalysisRecord, RefitRecord, RefitScheduleRecord
from upscale.control.schemas import RefitPublic, RefitRequest, RefitRun, RefitScheduleCreate
from upscale.control.services import Services
from upscale.control.supervised import SupervisedLoop
from upscale.orchestrator.clock import as_utc, utcnow
from upscale.orchestrator.records import ObservationRecord, SweepSegmentRecord

STUCK_AFTER_S = 3600.0  # a refit runs one analysis: longer than any of them takes


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


def _law_params(record: AnalysisRecord) -> dict[str, dict[str, float]]:
    """An analysis's fitted parameters per law: `scratch`, and `upcycled <group>` per upcycling group."""
    data = record.record or {}
    out = {"scratch": data["scratch"]["params"]} if data.get("scratch") else {}
    for up in data.get("upcycled", []):
        if up["fit"] is not None:
            out[f"upcycled {up['label']}".strip()] = up["fit"]["params"]
    return out


def _best_dstar(record: AnalysisRecord, n1: float | None) -> tuple[dict[str, Any] | None, str | None]:
    """D* at ``n1`` (default: the analysis's largest N1) of the group from-scratch takes longest to catch (the best
    way to upcycle there), and the group; Nones when no group has a D* there. A D* beyond the searched range (upcycling
    wins throughout) counts as the longest."""
    best, group = None, None
    rank = {"below": 0, "crossing": 1, "observed": 1, "above": 2}  # observed: the runs' bracket, no projection
    for up in (record.record or {}).get("upcycled", []):
        results = (up["dstar"] or {}).get("results", [])
        at = n1 if n1 is not None else max((r["n1"] for r in results), default=None)
        result = next((r for r in results if r["n1"] == at), None)
        if result is None:
            continue
        key = (rank[result["dstar_state"]], result["dstar"] or 0.0)
        if best is None or key > (rank[best["dstar_state"]], best["dstar"] or 0.0):
            best, group = result, up["label"]
    return best, group


def _ci95(answer: dict[str, Any] | None) -> list[float | None] | None:
    """The answer's 95% interval as [low, high], an open end as null."""
    iv = ((answer or {}).get("intervals") or {}).get("95")
    return None if iv is None else [iv["low"], iv["high"]]


def _diff(s: Session, old: RefitRecord | None, params: dict[str, dict[str, float]], dstar: float | None) -> dict:
    """New minus old, per law per parameter, and for D*; empty for version 1."""
    if old is None:
        return {}
    out: dict = {}
    before = _law_params(s.get(AnalysisRecord, old.analysis_id))
    for law, values in params.items():
        if law in before:
            out[law] = {k: v - before[law][k] for k, v in values.items()
                        if v is not None and before[law].get(k) is not None}
    if dstar is not None and old.dstar is not None:
        out["dstar"] = dstar - old.dstar
    return out


def _latest(s: Session, schedule_id: str) -> RefitRecord | None:
    return s.scalar(select(RefitRecord).where(RefitRecord.schedule_id == schedule_id)
                    .order_by(RefitRecord.version.desc()).limit(1))


def run_refit(services: Services, schedule: RefitScheduleRecord, force: bool = False,
              cache: ObservationCache | None = None) -> RefitRecord | None:
    """Record the next version when the inputs changed since the latest one: the analysis of the schedule's sweeps
    (control/analyses.py; D* at its n1). Unchanged inputs run and record nothing: the latest version comes back,
    ``.new`` False (a new one has ``.new`` True). None when not ``force`` and these inputs are the ones last tried,
    failed tries included (the loop's on_new_observations check). FitError if the analysis fails, NotReady when the
    sweeps have no observations.

    ``cache`` (one refit tick's) shares observation reads between schedules; the analysis then uses the very tables
    that were hashed."""
    req = RefitRequest.model_validate(schedule.request)
    cache = cache if cache is not None else ObservationCache(services)
    tables = sweep_tables(services, req.sweep_ids, cache)
    trunks = curve_trunks(services, req.sweep_ids, curves=True, cache=cache)  # finished curves move the predictions
    digest = inputs_hash(observations_hash(tables),
                         analysis_params([req.n1] if req.n1 else None, req.bootstrap, 0, trunks=trunks),
                         refit_owner=schedule.owner)
    with services.store.transaction() as s:  # a conditional UPDATE: of racing loops, one fires on new inputs
        mark = update(RefitScheduleRecord).where(RefitScheduleRecord.id == schedule.id).values(last_checked_hash=digest)
        if not force:
            mark = mark.where(or_(RefitScheduleRecord.last_checked_hash.is_(None),
                                  RefitScheduleRecord.last_checked_hash != digest))
        if s.execute(mark).rowcount == 0:
            return None
        latest = _latest(s, schedule.id)
        if latest is not None and latest.inputs_hash == digest:  # a cron minute or a request on unchanged inputs
            s.get(RefitScheduleRecord, schedule.id).last_error = None
            return latest
    tried, schedule.last_checked_hash = schedule.last_checked_hash, digest
    try:
        analysis = run_analysis(services, req.sweep_ids, n1s=[req.n1] if req.n1 else None, bootstrap=req.bootstrap,
                                owner=schedule.owner, trigger="refit", tables=tables, trunks=trunks)
    except AnalysisRunning:  # another of the owner's triggers runs these inputs: the next tick refits with it
        with services.store.transaction() as s:
            s.execute(update(RefitScheduleRecord).where(RefitScheduleRecord.id == schedule.id,
                                                        RefitScheduleRecord.last_checked_hash == digest)
                      .values(last_checked_hash=tried))
        schedule.last_checked_hash = tried
        raise
    answer, group = _best_dstar(analysis, req.n1)
    dstar, ci = (answer or {}).get("dstar"), _ci95(answer)
    with services.store.transaction() as s:
        s.get(RefitScheduleRecord, schedule.id).last_error = None
        prev = _latest(s, schedule.id)
        if prev is not None and prev.inputs_hash == digest:  # a racing refit recorded these inputs meanwhile
            return prev
        diff = _diff(s, prev, _law_params(analysis), dstar)
        left = bool(prev and prev.dstar_ci and dstar is not None and None not in prev.dstar_ci
                    and not prev.dstar_ci[0] <= dstar <= prev.dstar_ci[1])
        record = RefitRecord(schedule_id=schedule.id, version=(prev.version if prev else 0) + 1, inputs_hash=digest,
                             analysis_id=analysis.id, dstar=dstar, dstar_ci=ci, dstar_answer=answer,
                             dstar_group=group, diff=diff, left_interval=left)
        s.add(record)
    record.new = True
    return record


def run_answer(record: RefitRecord) -> RefitRun:
    """What refitting now answers (POST /refit-schedules/{id}/run, `upscale refit run`): the version, and whether
    it is the latest one again."""
    public = RefitPublic.model_validate(record, from_attributes=True)
    return RefitRun(**public.model_dump(), unchanged=not record.new)


def lag_s(services: Services) -> dict[str, float]:
    """Per active schedule, seconds since its sweeps first had an observation its latest version has not seen (its
    analysis started before it): how far its refits lag behind their inputs. 0 while the latest version has every
    observation, and while there are none, however long nothing new arrives; before a first version, since the
    oldest observation."""
    now, out = utcnow(), {}
    with services.store.transaction() as s:
        for schedule in s.scalars(select(RefitScheduleRecord).where(RefitScheduleRecord.active)):
            seen = s.scalar(select(AnalysisRecord.created_at)
                            .join(RefitRecord, RefitRecord.analysis_id == AnalysisRecord.id)
                            .where(RefitRecord.schedule_id == schedule.id)
                            .order_by(RefitRecord.version.desc()).limit(1))
            first = (select(func.min(ObservationRecord.created_at))
                     .join(SweepSegmentRecord, SweepSegmentRecord.segment_key == ObservationRecord.segment_key)
                     .where(SweepSegmentRecord.sweep_id.in_(schedule.request.get("sweep_ids", []))))
            unseen = s.scalar(first if seen is None else first.where(ObservationRecord.created_at > seen))
            out[schedule.id] = 0.0 if unseen is None else max(0.0, (now - as_utc(unseen)).total_seconds())
    return out


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


class RefitLoop(SupervisedLoop):
    """Fires due schedules every ``tick_s``; a failing refit is noted on its schedule, never fatal to the loop
    (control/supervised.py: nor is a failing store)."""

    def __init__(self, services: Services, tick_s: float = 5.0) -> None:
        super().__init__("upscale-refits", tick_s, stuck_after_s=STUCK_AFTER_S)
        self.services = services

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
            except Exception as e:  # any refit's failure is its schedule's, never the others'
                fail(self.services, schedule.id, str(e))
