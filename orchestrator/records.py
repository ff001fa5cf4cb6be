"""The database schema as SQLAlchemy 2 models (`*Record`, docs/conventions.md "Names"); Alembic migrations create it.

A segment row is keyed by its content id (`SegmentSpec.id`), so two sweeps that need the same training job share one
row, one set of checkpoints and one MLflow run; `sweep_segments` says which sweeps want it. Types are portable
(JSON, BigInteger for token and parameter counts, timezone-aware timestamps) so the same schema runs on SQLite and
PostgreSQL.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar, Literal

from sqlalchemy import JSON, BigInteger, Boolean, DateTime, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy import false as sa_false
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from upscale.orchestrator.clock import utcnow

SweepStatus = Literal["pending", "running", "done", "failed", "cancelling", "cancelled"]
SegmentStatus = Literal["pending", "running", "done", "failed"]
AttemptStatus = Literal["running", "done", "failed", "cancelled", "orphaned", "adopted", "invalidated"]
CheckpointRole = Literal["final", "branch"]


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dict[str, Any]: JSON, list[str]: JSON, datetime: DateTime(timezone=True),
    }


class SweepRecord(Base):
    """One submitted grid; its segments are shared with any other sweep that needs them."""

    __tablename__ = "sweeps"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    spec: Mapped[dict[str, Any]] = mapped_column(doc="The validated sweep spec as JSON.")
    spec_hash: Mapped[str | None] = mapped_column(String(64), index=True, doc="`fingerprint` of the validated spec: "
                                                  "an identical re-submission finds this sweep (None before 0004).")
    resources: Mapped[dict[str, Any]] = mapped_column(doc="Ray resources per segment: cpus, gpus, workers.")
    status: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))
    error: Mapped[str | None] = mapped_column(Text)
    runner: Mapped[str | None] = mapped_column(String(200), doc="Scheduler driving it while running or cancelling "
                                               "(host:pid:nonce).")
    runner_heartbeat_at: Mapped[datetime | None] = mapped_column(doc="When its runner last said it was alive.")
    stale_segments: Mapped[dict[str, Any] | None] = mapped_column(JSON, doc="Planned segment key -> the key of the "
                                                                  "same job the store held trained under an older "
                                                                  "training-semantics version, when it was recorded.")
    reuse_stale: Mapped[bool] = mapped_column(Boolean, default=False, server_default=sa_false(),
                                              doc="The user asked to reuse those stale results (`--reuse-stale`).")
    submission_key: Mapped[str | None] = mapped_column(String(64), index=True, unique=True,
                                                       doc="Unique: who submitted which identical spec, so concurrent "
                                                       "identical submissions record one sweep (None: `new` ones).")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class SegmentRecord(Base):
    """One training job, keyed by its content id; `status` moves pending -> running -> done | failed."""

    __tablename__ = "segments"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32), index=True)
    config: Mapped[dict[str, Any]] = mapped_column(doc="SegmentSpec as JSON; its hash is `key`.")
    parents: Mapped[list[str]] = mapped_column(doc="Keys of the segments this one starts from.")
    status: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    flops: Mapped[float] = mapped_column(Float, default=0.0)
    trunk: Mapped[str | None] = mapped_column(String(64), doc="The trunk this segment branches from (bootstrap).")
    observation: Mapped[dict[str, Any] | None] = mapped_column(JSON, doc="Planned observation, if any.")
    semantics: Mapped[int] = mapped_column(Integer, server_default="1",
                                           doc="Training-semantics version of `config` (TRAINING_SEMANTICS).")
    unversioned_key: Mapped[str | None] = mapped_column(String(64), index=True, doc="`SegmentSpec.unversioned_id`: "
                                                        "equal for the same job under any training-semantics version.")
    reused_from: Mapped[str | None] = mapped_column(String(64), doc="The stale segment (older version) whose result "
                                                    "and checkpoints this one was recorded done with (--reuse-stale).")
    checkpoint_uri: Mapped[str | None] = mapped_column(Text)
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, doc="SegmentResult as JSON once done.")
    owner: Mapped[str | None] = mapped_column(String(200), doc="Scheduler running it (host:pid:nonce).")
    heartbeat_at: Mapped[datetime | None] = mapped_column()
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class SweepSegmentRecord(Base):
    """Membership: which sweeps need a segment, in topological order, with that sweep's grid axes."""

    __tablename__ = "sweep_segments"

    sweep_id: Mapped[str] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"), primary_key=True)
    segment_key: Mapped[str] = mapped_column(ForeignKey("segments.key"), primary_key=True, index=True)
    position: Mapped[int] = mapped_column(Integer)
    axes: Mapped[dict[str, Any]] = mapped_column()


class AttemptRecord(Base):
    """One try at a segment: who ran it, how it ended, where it resumed from."""

    __tablename__ = "attempts"
    __table_args__ = (UniqueConstraint("segment_key", "number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    segment_key: Mapped[str] = mapped_column(ForeignKey("segments.key"), index=True)
    number: Mapped[int] = mapped_column(Integer, doc="1 for the first attempt.")
    owner: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), default="running")
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column()
    wall_s: Mapped[float | None] = mapped_column(Float, doc="Compute time the worker reported.")
    error: Mapped[str | None] = mapped_column(Text)


class ObservationRecord(Base):
    """One point for the fitter: a decay segment's final validation loss at its grid coordinates."""

    __tablename__ = "observations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    segment_key: Mapped[str] = mapped_column(ForeignKey("segments.key"), unique=True)
    kind: Mapped[str] = mapped_column(String(16), index=True, doc="dense | upcycled | scratch | expanded")
    N1: Mapped[int | None] = mapped_column(BigInteger)
    D1: Mapped[int | None] = mapped_column(BigInteger)
    D2: Mapped[int | None] = mapped_column(BigInteger)
    D: Mapped[int | None] = mapped_column(BigInteger)
    N2: Mapped[int | None] = mapped_column(BigInteger)
    N_total: Mapped[int | None] = mapped_column(BigInteger)
    n_expert: Mapped[int | None] = mapped_column(Integer)
    topk: Mapped[int | None] = mapped_column(Integer)
    parent_experts: Mapped[int | None] = mapped_column(Integer, doc="expanded: the parent MoE's experts E.")
    method: Mapped[str | None] = mapped_column(String(32))
    r: Mapped[float | None] = mapped_column(Float)
    loss: Mapped[float] = mapped_column(Float)
    trunk: Mapped[str] = mapped_column(String(64), doc="Trunk segment key; branches of one trunk share noise.")
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class CheckpointRecord(Base):
    """A checkpoint a segment wrote (its final one, or a trunk's branch point); `deleted_at` once collected."""

    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("segment_key", "role", "tokens"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    segment_key: Mapped[str] = mapped_column(ForeignKey("segments.key"), index=True)
    role: Mapped[str] = mapped_column(String(16))
    tokens: Mapped[int] = mapped_column(BigInteger)
    uri: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    deleted_at: Mapped[datetime | None] = mapped_column()
