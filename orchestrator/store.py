"""The state store: every state change of sweeps, segments, attempts, observations and checkpoints, one transaction
each, on SQLite (default) or PostgreSQL.

Opening a store runs the Alembic migrations shipped in `orchestrator/migrations` up to head, so a fresh file and an
old one end at the same schema. Claiming a segment is a compare-and-set (`UPDATE ... WHERE status = 'pending'`):
exactly one scheduler wins it, on SQLite (one writer at a time) and on PostgreSQL (row lock, then the WHERE is
re-checked), which is what makes sweeps idempotent across processes (docs/architecture.md, "State and storage").
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from importlib.resources import files
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, case, create_engine, delete, event, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from upscale.home import private_file
from upscale.orchestrator.clock import utcnow
from upscale.orchestrator.errors import ConflictError, NotFoundError
from upscale.orchestrator.hooks import Hooks
from upscale.orchestrator.records import (
    AttemptRecord,
    Base,
    CheckpointRecord,
    ObservationRecord,
    SegmentRecord,
    SweepRecord,
    SweepSegmentRecord,
)
from upscale.sweeps.planner import PlannedSegment
from upscale.sweeps.reuse import unversioned_ids
from upscale.sweeps.segments import TRUNK_KINDS, SegmentResult

KEYS_PER_QUERY = 10000  # bound parameters per IN (...) query: SQLite allows 32766, PostgreSQL 65535


def chunks(keys: Iterable[str], size: int = KEYS_PER_QUERY) -> Iterator[list[str]]:
    """``keys`` in slices of at most ``size``, one IN (...) list each, so that no query of any grid's keys passes
    more bound parameters than SQLite allows (it refuses the statement: "too many SQL variables")."""
    keys = list(keys)
    for i in range(0, len(keys), size):
        yield keys[i:i + size]


def make_engine(url: str) -> Engine:
    """An engine with SQLite set up for several processes: WAL, a busy timeout, foreign keys enforced."""
    if url.startswith("sqlite:///"):
        private_file(Path(url.removeprefix("sqlite:///")))  # 0600, before SQLite creates it 0644
        engine = create_engine(url, connect_args={"timeout": 60})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True)


def alembic_config(connection: Connection) -> Config:
    """Alembic configured in code on ``connection`` with the packaged migrations (no alembic.ini needed)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(files("upscale.orchestrator") / "migrations"))
    cfg.attributes["connection"] = connection
    return cfg


def migrate(engine: Engine) -> None:
    """Run the packaged Alembic migrations on ``engine`` up to head."""
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "head")


class Store:
    """Typed operations on the state database; every method is one transaction."""

    def __init__(self, url: str, hooks: Hooks | None = None) -> None:
        self.url = url
        self.hooks = hooks or Hooks()
        self.engine = make_engine(url)
        migrate(self.engine)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """One transaction: committed when the block ends, rolled back if it raises."""
        with self._sessions.begin() as session:
            yield session

    # -- sweeps ---------------------------------------------------------------------------------------------------

    def create_sweep(self, name: str, spec: dict[str, Any], resources: dict[str, Any],
                     segments: Sequence[PlannedSegment], spec_hash: str | None = None,
                     stale: Mapping[str, str] | None = None, reuse_stale: bool = False,
                     other_cuts: Mapping[str, str] | None = None, submission_key: str | None = None,
                     rows: Callable[[str], Iterable[Base]] | None = None,
                     check: Callable[[Session], None] | None = None) -> SweepRecord:
        """Record a sweep and its segments; segments another sweep already created are shared, not duplicated.

        ``stale`` (`holdings`) maps planned segments to done ones of the same job under an older training-semantics
        version; it is recorded on the sweep, and with ``reuse_stale`` their results are taken over (`adopt_stale`)
        in the same transaction, so no scheduler can start training them in between. ``other_cuts``
        (`other_cut_holdings`) maps planned segments to done ones of the same job under another key (another cut of
        its chain): the same computation, always taken over the same way, each recording the old key in
        `reused_from`.

        ``submission_key`` is unique among sweeps: of identical submissions racing each other one records its sweep,
        the others raise `SweepExists` with it. ``rows(sweep_id)``: records written in the same transaction (its
        owner), so no reader ever sees the sweep without them. ``check(session)`` runs in that transaction once the
        sweep and its rows are written (the write lock held on SQLite), and may raise to record nothing (a quota
        counted with the new sweep). A new segment another submission recorded meanwhile fails the insert once; the
        retry shares it."""
        for last_try in (False, True):
            try:
                return self._create_sweep(name, spec, resources, segments, spec_hash, stale, reuse_stale,
                                          other_cuts, submission_key, rows, check)
            except IntegrityError:
                if submission_key is not None:
                    with self.transaction() as s:
                        found = s.scalar(select(SweepRecord).where(SweepRecord.submission_key == submission_key))
                    if found is not None:
                        raise SweepExists(found) from None
                if last_try:
                    raise
        raise AssertionError("unreachable")

    def _create_sweep(self, name: str, spec: dict[str, Any], resources: dict[str, Any],
                      segments: Sequence[PlannedSegment], spec_hash: str | None, stale: Mapping[str, str] | None,
                      reuse_stale: bool, other_cuts: Mapping[str, str] | None, submission_key: str | None,
                      rows: Callable[[str], Iterable[Base]] | None,
                      check: Callable[[Session], None] | None) -> SweepRecord:
        sweep = SweepRecord(id=uuid.uuid4().hex[:12], name=name, spec=spec, spec_hash=spec_hash, resources=resources,
                            status="pending", stale_segments=dict(stale) if stale else None, reuse_stale=reuse_stale,
                            submission_key=submission_key)
        unversioned = unversioned_ids(segments)
        with self.transaction() as s:
            s.add(sweep)
            s.flush()  # the sweep's row first: a duplicate submission fails on its key before any segment is written
            s.add_all(rows(sweep.id) if rows else ())
            if check is not None:
                s.flush()
                check(s)
            known = {k for part in chunks(p.id for p in segments)
                     for k in s.scalars(select(SegmentRecord.key).where(SegmentRecord.key.in_(part)))}
            for position, p in enumerate(segments):
                if p.id not in known:
                    s.add(SegmentRecord(
                        key=p.id, kind=p.spec.kind, config=p.spec.model_dump(mode="json"),
                        parents=list(p.spec.parent_ids), status="pending", attempts=0, tokens=int(p.tokens),
                        flops=float(p.flops), trunk=p.trunk,
                        observation=dataclasses.asdict(p.observation) if p.observation else None,
                        semantics=p.spec.semantics, unversioned_key=unversioned[p.id],
                    ))
                    known.add(p.id)
                s.add(SweepSegmentRecord(sweep_id=sweep.id, segment_key=p.id, position=position,
                                         axes={k: v for k, v in p.axes.items()}))
            taken = {**(stale if reuse_stale and stale else {}), **(other_cuts or {})}
            if taken:
                s.flush()
                self._adopt_stale(s, taken)
        return sweep

    def holdings(self, unversioned: Mapping[str, str]) -> tuple[set[str], dict[str, str]]:
        """What the store holds of planned segments (``unversioned``: planned key -> `reuse.unversioned_id`):
        the keys done, and for each one not done the key of a done segment of the same job trained under another
        training-semantics version (stale), the newest version's first; one transaction."""
        keys = list(unversioned)
        with self.transaction() as s:
            done = {k for part in chunks(keys) for k in s.scalars(
                select(SegmentRecord.key).where(SegmentRecord.key.in_(part), SegmentRecord.status == "done"))}
            wanted = {u: k for k, u in unversioned.items() if k not in done}
            planned = set(keys)
            rows = sorted((r for part in chunks(wanted) for r in s.execute(
                select(SegmentRecord.key, SegmentRecord.unversioned_key, SegmentRecord.semantics,
                       SegmentRecord.updated_at)
                .where(SegmentRecord.unversioned_key.in_(part), SegmentRecord.status == "done"))
                           if r.key not in planned), key=lambda r: (r.semantics, r.updated_at))
            stale = {wanted[u]: old for old, u, _, _ in rows}  # ascending: the newest version's row is written last
        return done, {k: stale[k] for k in keys if k in stale}

    def other_cut_holdings(self, old_keys: Mapping[str, Sequence[str]], piece_ends: Mapping[str, int]
                        ) -> dict[str, str]:
        """Planned key -> a done segment the store holds under one of its other keys (``old_keys``:
        `reuse.other_cuts`: another cut of its chain): the same job,
        or for a trunk piece (``piece_ends``: its end tokens) a segment that kept a checkpoint there; one
        transaction."""
        wanted = list({o for olds in old_keys.values() for o in olds})
        if not wanted:
            return {}
        rows: dict[str, SegmentRecord] = {}
        with self.transaction() as s:
            for part in chunks(wanted):
                rows.update((r.key, r) for r in s.scalars(select(SegmentRecord).where(
                    SegmentRecord.key.in_(part), SegmentRecord.status == "done")))
        out = {}
        for key, olds in old_keys.items():
            end = piece_ends.get(key)
            found = next((o for o in olds if o in rows and (end is None or checkpoint_at(rows[o], end))), None)
            if found is not None:
                out[key] = found
        return out

    def adopt_stale(self, sweep_id: str, stale: Mapping[str, str]) -> list[str]:
        """Record the sweep's planned segments in ``stale`` as done with the results of the stale segments they map to
        (`holdings`), and mark the sweep as reusing them; returns the keys taken over (those still pending)."""
        with self.transaction() as s:
            sweep = s.get(SweepRecord, sweep_id)
            if sweep is None:
                raise no_sweep(sweep_id)
            sweep.reuse_stale = True
            sweep.stale_segments = {**(sweep.stale_segments or {}), **stale}
            return self._adopt_stale(s, stale)

    def _adopt_stale(self, s: Session, stale: Mapping[str, str]) -> list[str]:
        """Each pending (or failed) segment in ``stale`` becomes done with its old segment's result, checkpoints and
        observation: its children start from the old checkpoints, as from any done parent's. A trunk piece taking
        over a piece of another cut of its chain gets that piece's checkpoint at its end as its final one."""
        olds = {r.key: r for part in chunks(set(stale.values()))
                for r in s.scalars(select(SegmentRecord).where(SegmentRecord.key.in_(part)))}
        ckpts = [c for part in chunks(olds) for c in s.scalars(select(CheckpointRecord).where(
            CheckpointRecord.segment_key.in_(part), CheckpointRecord.deleted_at.is_(None)))]
        by_segment: dict[str, list[CheckpointRecord]] = {}
        for c in ckpts:
            by_segment.setdefault(c.segment_key, []).append(c)
        now, adopted = utcnow(), []
        for key, old_key in stale.items():
            seg, old = s.get(SegmentRecord, key), olds.get(old_key)
            if seg is None or old is None or old.status != "done" or seg.status not in ("pending", "failed"):
                continue
            result = {**(old.result or {}), "segment_id": key}
            rows = [(c.role, c.tokens, c.uri) for c in by_segment.get(old_key, [])]
            end = seg.config["end_tokens"]
            if seg.kind in TRUNK_KINDS and (seg.config["start_tokens"], end) != (old.config["start_tokens"],
                                                                                  old.config["end_tokens"]):
                uri = checkpoint_at(old, end)
                if uri is None:
                    continue
                result |= {"checkpoint": uri, "branch_checkpoints": {}, "tokens": seg.tokens, "val_loss": None}
                rows = [("final", end, uri)]
            seg.status, seg.result = "done", result
            # the old row's own column where its result does not name the checkpoint (a row filled by hand or by an
            # older version): adopting it must not fail the submission of the sweep that reuses it
            seg.checkpoint_uri = result.get("checkpoint", old.checkpoint_uri)
            seg.mlflow_run_id, seg.reused_from = old.mlflow_run_id, old.key
            seg.error, seg.updated_at = None, now
            for role, tokens, uri in rows:
                s.add(CheckpointRecord(segment_key=key, role=role, tokens=tokens, uri=uri))
            self._observe(s, seg, result.get("val_loss"))
            adopted.append(key)
        return adopted

    def sweep(self, sweep_id: str) -> SweepRecord:
        with self.transaction() as s:
            sweep = s.get(SweepRecord, sweep_id)
            if sweep is None:
                raise no_sweep(sweep_id)
            return sweep

    def sweeps(self, status: str | None = None) -> list[SweepRecord]:
        """Every sweep, or only those in ``status`` (an indexed column), oldest first."""
        q = select(SweepRecord).order_by(SweepRecord.created_at)
        with self.transaction() as s:
            return list(s.scalars(q if status is None else q.where(SweepRecord.status == status)))

    def sweeps_with_spec(self, spec_hash: str) -> list[SweepRecord]:
        """The sweeps recorded from an identical spec (an indexed column), newest first."""
        q = select(SweepRecord).where(SweepRecord.spec_hash == spec_hash).order_by(SweepRecord.created_at.desc())
        with self.transaction() as s:
            return list(s.scalars(q))

    def set_sweep(self, sweep_id: str, **fields: Any) -> None:
        """Update a sweep's status, MLflow run id or error."""
        with self.transaction() as s:
            s.execute(update(SweepRecord).where(SweepRecord.id == sweep_id).values(**fields, updated_at=utcnow()))

    def claim_sweep(self, sweep: SweepRecord, runner: str) -> bool:
        """Make ``runner`` the sweep's runner if its status and runner are still those read in ``sweep``: of two
        schedulers adopting one orphaned sweep (or starting one pending sweep), exactly one wins."""
        was = SweepRecord.runner.is_(None) if sweep.runner is None else SweepRecord.runner == sweep.runner
        with self.transaction() as s:
            return s.execute(update(SweepRecord).where(SweepRecord.id == sweep.id, SweepRecord.status == sweep.status,
                                                       was)
                             .values(runner=runner, runner_heartbeat_at=utcnow())).rowcount == 1

    def sweep_heartbeat(self, sweep_id: str, runner: str) -> None:
        """``runner`` still drives the sweep (it takes the sweep back if another scheduler on it released it)."""
        with self.transaction() as s:
            s.execute(update(SweepRecord).where(SweepRecord.id == sweep_id,
                                                (SweepRecord.runner == runner) | SweepRecord.runner.is_(None))
                      .values(runner=runner, runner_heartbeat_at=utcnow()))

    def release_sweep(self, sweep_id: str, runner: str) -> None:
        """``runner`` stops driving the sweep (unless another scheduler has taken it since)."""
        with self.transaction() as s:
            s.execute(update(SweepRecord).where(SweepRecord.id == sweep_id, SweepRecord.runner == runner)
                      .values(runner=None, runner_heartbeat_at=None))

    def request_cancel(self, sweep_id: str) -> None:
        """Ask the scheduler running ``sweep_id`` to stop, in one conditional UPDATE (no read first, so nothing a
        scheduler writes meanwhile is overwritten): a pending sweep no scheduler has claimed is cancelled at once; a
        claimed, running or cancelling one becomes cancelling, which its scheduler reads and acts on; one that has
        ended (done, failed, cancelled) stays as it ended."""
        unclaimed = (SweepRecord.status == "pending") & SweepRecord.runner.is_(None)
        with self.transaction() as s:
            changed = s.execute(update(SweepRecord)
                                .where(SweepRecord.id == sweep_id,
                                       SweepRecord.status.in_(("pending", "running", "cancelling")))
                                .values(status=case((unclaimed, "cancelled"), else_="cancelling"),
                                        updated_at=utcnow())).rowcount
            if not changed and s.get(SweepRecord, sweep_id) is None:
                raise no_sweep(sweep_id)

    def start_sweep(self, sweep_id: str) -> bool:
        """Its scheduler starts the sweep: running, unless a cancel came first (it stays cancelling, and the
        scheduler's first poll stops it); one conditional UPDATE. True if it is now running."""
        with self.transaction() as s:
            return s.execute(update(SweepRecord).where(SweepRecord.id == sweep_id, SweepRecord.status != "cancelling")
                             .values(status="running", error=None, updated_at=utcnow())).rowcount == 1

    def requeue(self, sweep_id: str, check: Callable[[Session], None] | None = None) -> bool:
        """A sweep that failed or was cancelled goes back to pending (an identical submission asks for it again);
        one conditional UPDATE, so a sweep that is running meanwhile is left alone. True if it was requeued.
        ``check``: as `create_sweep`'s, run once it is requeued."""
        with self.transaction() as s:
            requeued = s.execute(update(SweepRecord).where(SweepRecord.id == sweep_id,
                                                           SweepRecord.status.in_(("failed", "cancelled")))
                                 .values(status="pending", error=None, updated_at=utcnow())).rowcount == 1
            if requeued and check is not None:
                check(s)
            return requeued

    def members(self, sweep_id: str) -> list[tuple[SegmentRecord, SweepSegmentRecord]]:
        """The sweep's segments in topological order, with this sweep's membership row (axes)."""
        with self.transaction() as s:
            return self._members(s, sweep_id)

    def poll(self, sweep_id: str) -> tuple[str, list[tuple[SegmentRecord, SweepSegmentRecord]]]:
        """The sweep's status and `members`, read in one transaction: what the scheduler checks on every pass."""
        with self.transaction() as s:
            members = self._members(s, sweep_id)
            status = s.scalar(select(SweepRecord.status).where(SweepRecord.id == sweep_id))
            if status is None:
                raise no_sweep(sweep_id)
            return status, members

    @staticmethod
    def _members(s: Session, sweep_id: str) -> list[tuple[SegmentRecord, SweepSegmentRecord]]:
        rows = s.execute(select(SegmentRecord, SweepSegmentRecord)
                         .join(SweepSegmentRecord, SweepSegmentRecord.segment_key == SegmentRecord.key)
                         .where(SweepSegmentRecord.sweep_id == sweep_id)
                         .order_by(SweepSegmentRecord.position))
        return [(seg, link) for seg, link in rows]

    # -- segments -------------------------------------------------------------------------------------------------

    def segment(self, key: str) -> SegmentRecord:
        with self.transaction() as s:
            seg = s.get(SegmentRecord, key)
            if seg is None:
                raise NotFoundError(f"no segment {key!r}")
            return seg

    def segments(self, keys: Sequence[str]) -> dict[str, SegmentRecord]:
        with self.transaction() as s:
            return {r.key: r for part in chunks(keys)
                    for r in s.scalars(select(SegmentRecord).where(SegmentRecord.key.in_(part)))}

    def claim(self, key: str, owner: str) -> AttemptRecord | None:
        """Move a pending segment to running under ``owner`` and open an attempt; None if someone else has it."""
        now = utcnow()
        with self.transaction() as s:
            won = s.execute(update(SegmentRecord)
                            .where(SegmentRecord.key == key, SegmentRecord.status == "pending")
                            .values(status="running", owner=owner, heartbeat_at=now, error=None, updated_at=now,
                                    attempts=SegmentRecord.attempts + 1)).rowcount
            if won != 1:
                return None
            number = s.scalar(select(SegmentRecord.attempts).where(SegmentRecord.key == key))
            attempt = AttemptRecord(segment_key=key, number=number, owner=owner, status="running", started_at=now)
            s.add(attempt)
        return attempt

    def set_segment_run(self, key: str, mlflow_run_id: str) -> None:
        with self.transaction() as s:
            s.execute(update(SegmentRecord).where(SegmentRecord.key == key).values(mlflow_run_id=mlflow_run_id))

    def heartbeat(self, owner: str) -> None:
        """Mark every segment ``owner`` runs as alive (another host judges orphans by this timestamp)."""
        with self.transaction() as s:
            s.execute(update(SegmentRecord).where(SegmentRecord.owner == owner, SegmentRecord.status == "running")
                      .values(heartbeat_at=utcnow()))

    def complete(self, key: str, attempt: AttemptRecord, result: SegmentResult, adopted: bool = False) -> bool:
        """Record a finished segment: result, checkpoints and its observation, atomically.

        False (nothing written) if the segment is no longer running under this attempt's owner.
        """
        now = utcnow()
        with self.transaction() as s:
            seg = s.scalar(select(SegmentRecord).where(SegmentRecord.key == key, SegmentRecord.status == "running",
                                                       SegmentRecord.owner == attempt.owner).with_for_update())
            if seg is None:
                return False
            seg.status, seg.result, seg.checkpoint_uri = "done", result.model_dump(mode="json"), result.checkpoint
            seg.owner, seg.heartbeat_at, seg.error, seg.updated_at = None, None, None, now
            self._end_attempt(s, attempt, "adopted" if adopted else "done", now, wall_s=result.wall_s)
            if result.checkpoint:
                s.add(CheckpointRecord(segment_key=key, role="final", tokens=seg.config["end_tokens"],
                                       uri=result.checkpoint))
            for tokens, uri in sorted(result.branch_checkpoints.items()):
                s.add(CheckpointRecord(segment_key=key, role="branch", tokens=int(tokens), uri=uri))
            self._observe(s, seg, result.val_loss)
        return True

    def _observe(self, s: Session, seg: SegmentRecord, loss: float | None) -> None:
        """Record the observation a done segment makes, if it plans one and has a loss."""
        if seg.observation is None or loss is None:
            return
        o = seg.observation
        s.add(ObservationRecord(
            segment_key=seg.key, kind=o["kind"], N1=o.get("N1"), D1=o.get("D1"), D2=o.get("D2"), D=o.get("D"),
            N2=o.get("N2"), N_total=o.get("N_total"), n_expert=o.get("n_expert"), topk=o.get("topk"),
            parent_experts=o.get("parent_experts"), method=o.get("method"), r=o.get("r"), loss=loss,
            trunk=seg.trunk or seg.key, mlflow_run_id=seg.mlflow_run_id,
        ))
        self.hooks.on_observation(s, seg.key, loss)

    def fail(self, key: str, attempt: AttemptRecord, error: str, max_attempts: int, retry: bool = True) -> str:
        """Close a failed attempt; the segment goes back to pending while failed attempts < ``max_attempts``.

        Returns the segment's new status (pending or failed).
        """
        now = utcnow()
        with self.transaction() as s:
            self._end_attempt(s, attempt, "failed", now, error=error)
            failed = s.scalar(select(func.count()).select_from(AttemptRecord)
                              .where(AttemptRecord.segment_key == key, AttemptRecord.status == "failed"))
            status = "pending" if retry and failed < max_attempts else "failed"
            s.execute(update(SegmentRecord).where(SegmentRecord.key == key, SegmentRecord.owner == attempt.owner)
                      .values(status=status, owner=None, heartbeat_at=None, error=error, updated_at=now))
        return status

    def release(self, key: str, attempt: AttemptRecord, reason: str) -> None:
        """Put a running segment back to pending without counting a failure (cancelled, or its scheduler died)."""
        now = utcnow()
        with self.transaction() as s:
            self._end_attempt(s, attempt, reason, now)
            s.execute(update(SegmentRecord).where(SegmentRecord.key == key, SegmentRecord.owner == attempt.owner,
                                                  SegmentRecord.status == "running")
                      .values(status="pending", owner=None, heartbeat_at=None, updated_at=now))

    def reset_failed(self, keys: Sequence[str]) -> None:
        """Give failed segments a fresh retry budget (a new run of a sweep that failed before)."""
        with self.transaction() as s:
            for part in chunks(keys):
                s.execute(update(AttemptRecord).where(AttemptRecord.segment_key.in_(part),
                                                      AttemptRecord.status == "failed").values(status="failed-reset"))
                s.execute(update(SegmentRecord).where(SegmentRecord.key.in_(part), SegmentRecord.status == "failed")
                          .values(status="pending", updated_at=utcnow()))

    def invalidate(self, key: str, by: str, before_commit: Callable[[Sequence[str]], None] | None = None
                   ) -> Invalidation:
        """Mark the done segment ``key`` and everything trained from it (its descendants in every sweep, and the
        segments that took over its result) for retraining, in one transaction: each goes back to pending with its
        result, observation and checkpoint rows dropped, and an attempt `invalidated` owned by ``by`` recording who
        did it; the sweeps holding them that had ended done or failed go back to pending, so a sweep loop retrains
        them. ConflictError (nothing changed) if ``key`` is not done or one of them is running.
        ``before_commit(keys)`` runs once the checks pass, before the segments can be claimed again (the caller
        deletes their checkpoint files there, so no retrained segment resumes from them). Concurrent invalidations of
        one segment are serialised: one wins, the others see it pending (ConflictError) and never call
        ``before_commit``."""
        now = utcnow()
        with self.transaction() as s:
            # A write first: it takes the row's lock (SQLite's write lock) before anything is read, so a racing
            # invalidation waits here and then reads the segment as the winner left it, not as it was.
            s.execute(update(SegmentRecord).where(SegmentRecord.key == key, SegmentRecord.status == "done")
                      .values(updated_at=now).execution_options(synchronize_session=False))
            target = s.get(SegmentRecord, key)
            if target is None:
                raise NotFoundError(f"no segment {key!r}; `upscale segments SWEEP` lists a sweep's segments")
            if target.status != "done":
                raise ConflictError(f"segment {key} is {target.status}: only a done segment can be invalidated")
            segs = self._trained_from(s, key)
            running = sorted(k for k, seg in segs.items() if seg.status == "running")
            if running:
                raise ConflictError(f"segment(s) {', '.join(running)} are running from {key}: cancel their sweep "
                                    f"(`upscale cancel SWEEP`) or wait for them to end, then invalidate {key} again")
            if before_commit is not None:
                before_commit(sorted(segs))
            reason = f"invalidated by {by!r} (segment {key} and what was trained from it train again)"
            for seg in segs.values():
                seg.attempts += 1
                s.add(AttemptRecord(segment_key=seg.key, number=seg.attempts, owner=by, status="invalidated",
                                    started_at=now, ended_at=now, error=reason))
                seg.status, seg.result, seg.checkpoint_uri, seg.reused_from = "pending", None, None, None
                seg.owner, seg.heartbeat_at, seg.mlflow_run_id = None, None, None  # a new MLflow run when it trains
                seg.error, seg.updated_at = reason, now
            keys = list(segs)
            for part in chunks(keys):
                s.execute(delete(ObservationRecord).where(ObservationRecord.segment_key.in_(part)))
                s.execute(delete(CheckpointRecord).where(CheckpointRecord.segment_key.in_(part)))
            sweeps = sorted({i for part in chunks(keys) for i in s.scalars(
                select(SweepSegmentRecord.sweep_id).where(SweepSegmentRecord.segment_key.in_(part)))})
            for part in chunks(sweeps):
                s.execute(update(SweepRecord)
                          .where(SweepRecord.id.in_(part), SweepRecord.status.in_(("done", "failed")))
                          .values(status="pending", error=f"segment {key} {reason}", updated_at=now))
        return Invalidation(segments=sorted(keys), sweeps=sweeps)

    @staticmethod
    def _trained_from(s: Session, key: str) -> dict[str, SegmentRecord]:
        """``key``'s segment and every segment trained from it: its children (in the sweeps that hold them) and the
        segments that took over its result (`reused_from`), and theirs, transitively."""
        found: dict[str, SegmentRecord] = {}
        frontier = {key}
        while frontier:  # each key is in the frontier once: the walk ends
            new: dict[str, SegmentRecord] = {}
            for part in chunks(frontier, KEYS_PER_QUERY // 2):  # the slice is bound twice
                new.update((r.key, r) for r in s.scalars(select(SegmentRecord).where(
                    SegmentRecord.key.in_(part) | SegmentRecord.reused_from.in_(part))))
                holding = select(SweepSegmentRecord.sweep_id).where(SweepSegmentRecord.segment_key.in_(part))
                members = s.scalars(select(SegmentRecord)
                                    .join(SweepSegmentRecord, SweepSegmentRecord.segment_key == SegmentRecord.key)
                                    .where(SweepSegmentRecord.sweep_id.in_(holding)))
                new.update((m.key, m) for m in members if frontier.intersection(m.parents))
            frontier = set(new) - set(found) - frontier
            found.update(new)
        return found

    def open_attempt(self, key: str) -> AttemptRecord | None:
        """The attempt currently running ``key``, if any."""
        with self.transaction() as s:
            return s.scalar(select(AttemptRecord).where(AttemptRecord.segment_key == key,
                                                        AttemptRecord.status == "running")
                            .order_by(AttemptRecord.number.desc()).limit(1))

    def attempts(self, key: str) -> list[AttemptRecord]:
        with self.transaction() as s:
            return list(s.scalars(select(AttemptRecord).where(AttemptRecord.segment_key == key)
                                  .order_by(AttemptRecord.number)))

    @staticmethod
    def _end_attempt(s: Session, attempt: AttemptRecord, status: str, now: Any, wall_s: float | None = None,
                     error: str | None = None) -> None:
        s.execute(update(AttemptRecord).where(AttemptRecord.id == attempt.id)
                  .values(status=status, ended_at=now, wall_s=wall_s, error=error))

    # -- observations ---------------------------------------------------------------------------------------------

    def observations(self, sweep_id: str) -> list[ObservationRecord]:
        """The sweep's observations in plan order (shared segments count for every sweep that needs them)."""
        self.sweep(sweep_id)
        with self.transaction() as s:
            link = SweepSegmentRecord.segment_key == ObservationRecord.segment_key
            return list(s.scalars(select(ObservationRecord).join(SweepSegmentRecord, link)
                                  .where(SweepSegmentRecord.sweep_id == sweep_id)
                                  .order_by(SweepSegmentRecord.position)))


@dataclasses.dataclass(frozen=True)
class Invalidation:
    """What `Store.invalidate` marked for retraining: segment keys, and the sweeps that hold them."""

    segments: list[str]
    sweeps: list[str]


def checkpoint_at(seg: SegmentRecord, tokens: int) -> str | None:
    """A done trunk's checkpoint at ``tokens``: a branch point it saved, or its end; None if it has none there."""
    result = seg.result or {}
    branches = {int(k): v for k, v in (result.get("branch_checkpoints") or {}).items()}
    if tokens in branches:
        return branches[tokens]
    return result.get("checkpoint") if tokens == seg.config["end_tokens"] else None


class SweepExists(Exception):
    """An identical submission recorded its sweep first (`Store.create_sweep`'s ``submission_key``)."""

    def __init__(self, sweep: SweepRecord) -> None:
        super().__init__(f"sweep {sweep.id} was recorded from this identical submission")
        self.sweep = sweep


def no_sweep(sweep_id: str) -> NotFoundError:
    """The one answer for an unknown sweep, whichever face asked: it names the way to list them of both."""
    return NotFoundError(f"no sweep {sweep_id!r}; `upscale status` (GET /sweeps) lists them")
