"""Checkpoint garbage collection: keep what pending or likely branches need, delete the rest when asked.

Kept: every checkpoint of a segment that has a child not yet done (the child starts from it, in any sweep), and,
unless `everything` is asked, the checkpoints new grid points are likely to branch from: the final dense model of
each `dense_decay` and `dense_import` (a new upcycling method or config starts there), each upcycled MoE (a new D2
grid means a new MoE trunk from it) and each trunk piece's checkpoint (a larger budget appends a piece to the last
one, a new budget at an existing branch point branches from it). Deleted: the rest, the final models of finished
decay branches (MoE and from scratch), which nothing trains from. A checkpoint deleted with `everything` that a later
sweep needs makes that sweep's segment fail with a clear error. Only checkpoints the store recorded are touched;
deleted ones keep their row with `deleted_at` set, so lineage stays queryable. A checkpoint is a path or a URI: both
are measured and deleted through `upscale.storage` (fsspec).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import select

from upscale import storage
from upscale.orchestrator.clock import utcnow
from upscale.orchestrator.records import CheckpointRecord, SegmentRecord
from upscale.orchestrator.store import Store
from upscale.sweeps.segments import BUILD_KINDS, TRUNK_KINDS

LIKELY_PARENT_KINDS = TRUNK_KINDS | {"dense_decay", "dense_import"} | BUILD_KINDS


@dataclass
class GcReport:
    kept: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    freed_bytes: int = 0


def collect_garbage(store: Store, everything: bool = False, dry_run: bool = False) -> GcReport:
    """Delete checkpoints no pending segment needs (and, unless ``everything``, no likely branch); one transaction."""
    report = GcReport()
    with store.transaction() as s:
        segments = list(s.scalars(select(SegmentRecord)))
        status = {seg.key: seg.status for seg in segments}
        kind = {seg.key: seg.kind for seg in segments}
        needed = {p for seg in segments if seg.status != "done" for p in seg.parents}
        live = list(s.scalars(select(CheckpointRecord).where(CheckpointRecord.deleted_at.is_(None))
                              .order_by(CheckpointRecord.id)))

        def keep(ckpt: CheckpointRecord) -> bool:
            kept = ckpt.segment_key in needed or status.get(ckpt.segment_key) != "done"
            return kept or (not everything and kind.get(ckpt.segment_key) in LIKELY_PARENT_KINDS)

        # A folder can have several rows: a trunk's final checkpoint may be its last branch point, and a segment that
        # took over a stale one's result (--reuse-stale) records the same folders; one row kept keeps the folder.
        kept_uris = {ckpt.uri for ckpt in live if keep(ckpt)}
        seen: set[str] = set()
        for ckpt in live:
            if ckpt.uri in kept_uris:
                report.kept.append(ckpt.uri)
                continue
            if ckpt.uri not in seen:
                report.freed_bytes += storage.size(ckpt.uri)
                report.deleted.append(ckpt.uri)
                seen.add(ckpt.uri)
            if not dry_run:
                storage.remove(ckpt.uri)
                ckpt.deleted_at = utcnow()
    return report
