"""Invalidating a segment whose checkpoints are corrupt or lost: it and everything trained from it train again.

What `POST /segments/{key}/invalidate` (an admin token) and `upscale segments invalidate` share. The store marks the
segments pending in one transaction (`Store.invalidate`, which refuses while one of them runs); their checkpoint
folders are deleted before that transaction commits, so a retrained segment never resumes from the bad files.
"""

from __future__ import annotations

from collections.abc import Sequence

from upscale import storage
from upscale.control.schemas import SegmentsInvalidated
from upscale.control.services import Services


def invalidate(services: Services, key: str, by: str) -> SegmentsInvalidated:
    """Mark the done segment ``key`` and its descendants for retraining, as ``by`` (recorded on each)."""

    def remove_checkpoints(keys: Sequence[str]) -> None:
        for k in keys:
            storage.remove(storage.join(services.settings.checkpoint_dir, k))

    done = services.store.invalidate(key, by, before_commit=remove_checkpoints)
    return SegmentsInvalidated(key=key, segments=done.segments, sweeps=done.sweeps, by=by)
