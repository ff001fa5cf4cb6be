"""Sweep operations behind the routes: submit with a plan summary and an owner, progress and cost, extend.

Recording goes through `Orchestrator.record`; this module adds what the API shows around it, and what a
server checks of a spec before planning it (`admit`): the grid within UPSCALE_MAX_SEGMENTS, data and model paths under
the data roots, resources the cluster has and models that fit one of its nodes' memory or one GPU's
(`check_memory`). The in-process CLI (`upscale run`, `upscale plan`) runs on the operator's own machine and is not
confined.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import ray
from sqlalchemy import Select, func, select, text
from sqlalchemy.orm import Session

from upscale.control.detail_cache import Detail
from upscale.control.plans import plan_summary
from upscale.control.records import SweepOwnerRecord
from upscale.control.schemas import SegmentProgress, SweepCreated, SweepDetail, SweepSummary
from upscale.control.services import LOCAL_OWNER, Services
from upscale.control.timing import timing
from upscale.data_roots import confine
from upscale.orchestrator.records import ObservationRecord, SegmentRecord, SweepRecord, SweepSegmentRecord
from upscale.orchestrator.scheduler import cluster_resources, ray_restarting
from upscale.orchestrator.service import spec_hash
from upscale.orchestrator.store import SweepExists, no_sweep
from upscale.sweeps.data_sources import BUILTIN_TOKENIZERS, check_present, confine_entry
from upscale.sweeps.loader import check_document
from upscale.sweeps.memory import check_memory
from upscale.sweeps.planner import Plan, plan
from upscale.sweeps.resources import ClusterResources, check_resources
from upscale.sweeps.segments import BUILTIN_CORPORA
from upscale.sweeps.spec import SweepSpec, parse_spec


def identical(services: Services, spec: SweepSpec, p: Plan, owner: str) -> SweepRecord | None:
    """``owner``'s newest sweep recorded from a spec identical to ``spec`` (planned as ``p``); another owner's sweeps
    never match. A sweep without an owner row was made in-process by `upscale run`, so it belongs to LOCAL_OWNER."""
    candidates = services.orch.identical(spec, p)
    if not candidates:
        return None
    with services.store.transaction() as s:
        rows = s.execute(select(SweepOwnerRecord.sweep_id, SweepOwnerRecord.owner)
                         .where(SweepOwnerRecord.sweep_id.in_([c.id for c in candidates])))
        owned = {sweep_id: who for sweep_id, who in rows}
    return next((c for c in candidates if owned.get(c.id, LOCAL_OWNER) == owner), None)


def admit(services: Services, data: Any) -> SweepSpec:
    """``data`` validated as a spec this server will plan: its grid within `max_segments` (refused before planning),
    its corpus, tokenizer and the dense model it starts from builtins or under the data roots (the model refused
    before its directory is read), its resources within the cluster's; SpecError otherwise."""
    settings = services.settings
    spec = parse_spec(data, max_segments=settings.max_segments,
                      check_path=lambda path: confine(path, settings.data_root_paths, instead=None))
    # the paths named, before anything reads them; every file under them is confined as `submit` plans (`plan`'s
    # data_roots), in the one walk that reads them
    if spec.data.corpus not in BUILTIN_CORPORA:
        confine_entry("data.corpus", spec.data.corpus, settings.data_root_paths)
        check_present("data.corpus", spec.data.corpus, settings.data_root_paths)
    if spec.data.tokenizer not in BUILTIN_TOKENIZERS:
        confine_entry("data.tokenizer", spec.data.tokenizer, settings.data_root_paths, instead="bytes, bpe")
    available = cluster(services)
    if available is not None:
        check_resources(spec, available)
        check_memory(spec, available.node_memory)
    return spec


def cluster(services: Services) -> ClusterResources | None:
    """What the cluster offers: RAY_ADDRESS's, or the embedded Ray this process runs (its sweep loop starts it, and
    restarts it if it dies); None when neither is there to ask (`upscale serve --no-scheduler` beside an embedded
    `upscale scheduler`). ClusterUnavailable (503) while the cluster is down."""
    if services.settings.ray_address is None and not ray.is_initialized() and not ray_restarting():
        return None
    have = cluster_resources(services.settings)
    memory = [n["Resources"].get("memory", 0) for n in ray.nodes() if n.get("Alive")]
    return have.model_copy(update={"node_memory": max(memory, default=None)})


def submit(services: Services, spec: SweepSpec, owner: str, extends: str | None = None,
           new: bool = False, reuse_stale: bool = False) -> SweepCreated:
    """Record ``spec`` as a sweep owned by ``owner``; segments already done anywhere are not retrained, nor, with
    ``reuse_stale``, those done under an older training-semantics version. Unless ``new``, the owner's sweep of an
    identical spec is returned instead (``existing``), queued again if it had failed or been cancelled. Every sweep
    made pending here counts against the owner's quota (`within_quota`), whatever route called."""
    p = plan(spec, services.settings.data_root_paths)
    check = services.orch.compare(p, reuse_stale)
    sweep = None if new else identical(services, spec, p, owner)
    existing = sweep is not None
    if sweep is None:
        try:  # the key makes concurrent identical submissions one sweep; the owner row is written with it
            sweep = services.orch.record(
                spec, check, submission_key=None if new else submission_key(owner, spec_hash(spec, p)),
                rows=lambda sweep_id: [SweepOwnerRecord(sweep_id=sweep_id, owner=owner, extends=extends)],
                check=within_quota(services, owner))
        except SweepExists as e:
            sweep, existing = e.sweep, True
    if existing:
        services.store.requeue(sweep.id, within_quota(services, owner))  # if it had failed or been cancelled
        if reuse_stale and check.stale:
            services.store.adopt_stale(sweep.id, check.stale)
        sweep = services.store.sweep(sweep.id)
    return SweepCreated(id=sweep.id, name=sweep.name, status=sweep.status, owner=owner, plan=plan_summary(check, spec),
                        existing=existing, reuse_stale=sweep.reuse_stale)


def submission_key(owner: str, spec_hash: str) -> str:
    """What makes two submissions one sweep: the same owner submitting an identical spec (`spec_hash`)."""
    return hashlib.sha256(json.dumps([owner, spec_hash]).encode()).hexdigest()


BUDGET_LISTS = frozenset({"d1", "d2", "scratch"})  # the lists under a `tokens` section, which must be ascending


def merge(base: dict[str, Any], additions: dict[str, Any], _section: str | None = None) -> dict[str, Any]:
    """``base`` with ``additions``: nested dicts merged, lists unioned, scalars replaced. A union keeps the base's
    order and appends what is new, except a token budget list (d1, d2, scratch of `tokens`, and of a size's
    `tokens` override), which sweeps/spec.py requires ascending: it comes out sorted, so a smaller or interior
    budget lands in its place. Other lists (sizes, methods, ...) keep their order: it names the grid's axes."""
    out = dict(base)
    for k, v in additions.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v, k)
        elif isinstance(v, list) and isinstance(out.get(k), list):
            out[k] = out[k] + [x for x in v if x not in out[k]]
            if _section == "tokens" and k in BUDGET_LISTS and all(_is_number(x) for x in out[k]):
                out[k] = sorted(out[k])
        else:
            out[k] = v
    return out


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def extend(services: Services, sweep_id: str, additions: dict[str, Any], owner: str,
           reuse_stale: bool = False) -> SweepCreated:
    """A new sweep whose spec is the old one plus ``additions``: only its new segments train."""
    check_document(additions, "additions")  # before `merge` recurses through it
    old = services.store.sweep(sweep_id)
    return submit(services, admit(services, merge(old.spec, additions)), owner, extends=sweep_id,
                  reuse_stale=reuse_stale)


class TooManyInFlight(RuntimeError):
    """The owner has UPSCALE_MAX_SWEEPS_IN_FLIGHT sweeps pending or running: HTTP 429."""

    def __init__(self, owner: str, in_flight: int, limit: int) -> None:
        super().__init__(f"token {owner!r} has {in_flight} sweeps pending or running, the most this server allows "
                         f"(UPSCALE_MAX_SWEEPS_IN_FLIGHT={limit}); wait for one to finish or cancel one "
                         f"(POST /sweeps/{{id}}/cancel)")


def _count_in_flight(owner: str) -> Select:
    """How many of ``owner``'s sweeps are pending or running: one indexed count."""
    return (select(func.count()).select_from(SweepOwnerRecord)
            .join(SweepRecord, SweepRecord.id == SweepOwnerRecord.sweep_id)
            .where(SweepOwnerRecord.owner == owner, SweepRecord.status.in_(("pending", "running"))))


def refuse_past_quota(services: Services, owner: str) -> None:
    """TooManyInFlight when ``owner`` already has its quota of sweeps in flight: the cheap early refusal, before a
    spec is parsed and planned (`within_quota` is the one that holds under races). Only where auth is on (a
    server): the in-process CLI holds the database itself and has no quota."""
    if not services.auth:
        return
    limit = services.settings.max_sweeps_in_flight
    with services.store.engine.connect() as conn:
        count = conn.execute(_count_in_flight(owner)).scalar_one()
    if count >= limit:
        raise TooManyInFlight(owner, count, limit)


def within_quota(services: Services, owner: str) -> Callable[[Session], None] | None:
    """What the store transaction that makes one of ``owner``'s sweeps pending checks before it commits: its sweeps
    in flight counted with the new one, TooManyInFlight (nothing recorded) past UPSCALE_MAX_SWEEPS_IN_FLIGHT. The
    transaction has written first, so on SQLite it holds the database's write lock and racing submissions count one
    after the other; on PostgreSQL a transaction-scoped advisory lock on the owner does the same, and the count,
    a statement after it, sees every sweep committed before. So servers sharing a store share the quota. None
    (no check) where auth is off."""
    if not services.auth:
        return None
    limit = services.settings.max_sweeps_in_flight

    def check(s: Session) -> None:
        if s.get_bind().dialect.name == "postgresql":
            s.execute(text("SELECT pg_advisory_xact_lock(hashtext(:key))"), {"key": f"upscale.in_flight.{owner}"})
        count = s.execute(_count_in_flight(owner)).scalar_one()
        if count > limit:
            raise TooManyInFlight(owner, count - 1, limit)

    return check


def owner_of(services: Services, sweep_id: str) -> str:
    """Who owns the sweep: its submitter's token name, or LOCAL_OWNER for a sweep `upscale run` made in-process (no
    owner row); NotFoundError if there is no such sweep."""
    services.store.sweep(sweep_id)
    with services.store.transaction() as s:
        row = s.get(SweepOwnerRecord, sweep_id)
        return row.owner if row is not None else LOCAL_OWNER


def owners(services: Services) -> dict[str, str]:
    with services.store.transaction() as s:
        return {r.sweep_id: r.owner for r in s.query(SweepOwnerRecord)}


def segment_counts(services: Services, sweep_id: str | None = None) -> dict[str, tuple[int, int]]:
    """(segments done, segments total) per sweep id, of every sweep or only ``sweep_id``, in one grouped query;
    a sweep without segments is absent."""
    q = (select(SweepSegmentRecord.sweep_id, SegmentRecord.status, func.count())
         .join(SegmentRecord, SegmentRecord.key == SweepSegmentRecord.segment_key)
         .group_by(SweepSegmentRecord.sweep_id, SegmentRecord.status))
    if sweep_id is not None:
        q = q.where(SweepSegmentRecord.sweep_id == sweep_id)
    counts: dict[str, tuple[int, int]] = {}
    with services.store.engine.connect() as conn:
        for sid, status, n in conn.execute(q):
            done, total = counts.get(sid, (0, 0))
            counts[sid] = (done + (n if status == "done" else 0), total + n)
    return counts


def summary(services: Services, sweep: SweepRecord, owner: str | None,
            counts: tuple[int, int] | None = None) -> SweepSummary:
    """``counts`` is (done, total) from `segment_counts`; queried for this one sweep when not given."""
    if counts is None:
        counts = segment_counts(services, sweep.id).get(sweep.id, (0, 0))
    return SweepSummary(id=sweep.id, name=sweep.name, status=sweep.status, owner=owner,
                        segments_done=counts[0], segments_total=counts[1], created_at=sweep.created_at)


def summaries(services: Services) -> list[SweepSummary]:
    """Every sweep, oldest first: three queries (sweeps, owners, segment counts by status) whatever their number."""
    listed = services.store.sweeps()
    owned, counts = owners(services), segment_counts(services)
    return [summary(services, s, owned.get(s.id), counts.get(s.id, (0, 0))) for s in listed]


def cancel(services: Services, sweep_id: str) -> SweepSummary:
    """Ask the sweep to stop (a running one releases its running segments first; a pending one is cancelled at
    once); the sweep as it stands. The caller checks who may."""
    services.store.request_cancel(sweep_id)
    return summary(services, services.store.sweep(sweep_id), owners(services).get(sweep_id))


def observations(services: Services, sweep_id: str, kind: str | None = None) -> list[ObservationRecord]:
    """The sweep's observations (only ``kind``'s rows, if given); NotFoundError if there is no such sweep."""
    return [o for o in services.store.observations(sweep_id) if kind is None or o.kind == kind]


def version(services: Services, sweep_id: str) -> tuple[Any, ...] | None:
    """What changes whenever the sweep's detail does (every store write to a sweep or segment sets `updated_at`);
    None if there is no such sweep. One Core query: this runs on every poll."""
    members = SweepSegmentRecord.sweep_id == sweep_id
    count = select(func.count()).select_from(SweepSegmentRecord).where(members).scalar_subquery()
    latest = (select(func.max(SegmentRecord.updated_at))
              .join(SweepSegmentRecord, SweepSegmentRecord.segment_key == SegmentRecord.key).where(members)
              .scalar_subquery())
    q = select(SweepRecord.updated_at, SweepRecord.status, count, latest).where(SweepRecord.id == sweep_id)
    with services.store.engine.connect() as conn:
        row = conn.execute(q).first()
    return None if row is None else tuple(row)


def detail_json(services: Services, sweep_id: str) -> tuple[str, bytes]:
    """`detail` as (ETag, JSON), rebuilt only when `version` changed: polling a 1,000-segment sweep costs one small
    query instead of loading and serialising every segment (bench/api_load.py); NotFoundError if there is no such
    sweep."""
    key = version(services, sweep_id)
    if key is None:
        raise no_sweep(sweep_id)
    cached = services.detail_cache.get(sweep_id)
    if cached is None or cached.version != key:
        body = detail(services, sweep_id).model_dump_json().encode()
        cached = Detail(key, body, f'"{hashlib.sha256(body).hexdigest()[:32]}"')
        services.detail_cache.put(sweep_id, cached)
    return cached.etag, cached.body


def detail(services: Services, sweep_id: str) -> SweepDetail:
    """Status, per-segment progress, FLOPs done vs planned, and its timing (control/timing.py)."""
    sweep = services.store.sweep(sweep_id)
    members = services.store.members(sweep_id)
    segs = [SegmentProgress(key=seg.key, kind=seg.kind, status=seg.status, attempts=seg.attempts, tokens=seg.tokens,
                            flops=seg.flops, axes=link.axes, val_loss=(seg.result or {}).get("val_loss"),
                            error=seg.error, reused_from=seg.reused_from) for seg, link in members]
    by_status = Counter(s.status for s in segs)
    with services.store.transaction() as s:
        owner = s.get(SweepOwnerRecord, sweep_id)
    return SweepDetail(
        id=sweep.id, name=sweep.name, status=sweep.status, owner=owner.owner if owner else None,
        segments_done=by_status["done"], segments_total=len(segs), created_at=sweep.created_at, error=sweep.error,
        mlflow_run_id=sweep.mlflow_run_id, by_status=dict(by_status),
        flops_done=sum(s.flops for s in segs if s.status == "done"), flops_planned=sum(s.flops for s in segs),
        stale_segments=sweep.stale_segments or {}, reuse_stale=sweep.reuse_stale,
        timing=timing(services, sweep, members), segments=segs)
