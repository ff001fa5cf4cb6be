"""What the layer above the orchestrator wants to hear of its work, passed in rather than imported: the orchestrator
never imports the control layer. `control/services.py` gives the prediction ledger's hooks (control/ledger.py); a
store opened without hooks (a worker process, a test of the scheduler alone) does nothing extra.

Every hook must be cheap and must not raise for a reason its caller could not fix: `before_launch` runs on the
scheduler's thread before each launch, `on_observation` inside the transaction that records an observation (what
it writes commits or rolls back with it), `sweep_metrics` once as a sweep ends."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from upscale.orchestrator.records import SegmentRecord
    from upscale.orchestrator.store import Store


def _nothing(*_: object) -> None:
    return None


def _no_metrics(*_: object) -> dict[str, float]:
    return {}


@dataclass(frozen=True)
class Hooks:
    before_launch: Callable[[Store, str, SegmentRecord], object] = _nothing
    """(store, sweep id, segment): a claimed segment of the sweep is about to train (its first attempt or a retry)."""
    on_observation: Callable[[Session, str, float], object] = _nothing
    """(session, segment key, loss): a done segment's observation is being recorded in ``session``."""
    sweep_metrics: Callable[[Store, str], dict[str, float]] = _no_metrics
    """(store, sweep id) -> metrics for the sweep's MLflow run, logged as it ends."""
