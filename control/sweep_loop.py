"""The sweep loop of `upscale serve` / `upscale scheduler`: run sweeps one after another on Ray.

Each sweep is driven by the orchestrator's `Scheduler`, which records itself as the sweep's runner. On every poll the
loop first *adopts* sweeps whose runner died (a server killed mid-sweep): a `running` one is resumed (finished
segments stay finished, running ones resume from their checkpoint), a `cancelling` one finishes cancelling. Then it
starts the oldest pending sweep the cluster has the resources for; one that needs more (a cluster that shrank since
it was submitted) stays pending with an error saying what it waits for, and never blocks the sweeps behind it.
Claiming a sweep is a compare-and-set on its runner, so of several servers on one store only one drives a sweep.

Stopping asks the running sweep to cancel (its running segments are released back to pending, nothing
half-recorded) and puts it back to pending, so the next start resumes it instead of leaving it cancelled.
"""

from __future__ import annotations

import threading
import traceback

from upscale.control.services import Services
from upscale.orchestrator.records import SweepRecord
from upscale.orchestrator.scheduler import Scheduler, cluster_resources, ensure_ray, runner_gone
from upscale.orchestrator.task import SegmentFn, train_segment
from upscale.sweeps.spec import ClusterResources, ResourcesSection, SpecError, SweepSpec, check_resources


class SweepLoop(threading.Thread):
    """Adopts orphaned sweeps, else runs the oldest pending sweep that can run, every ``poll_s``."""

    def __init__(self, services: Services, poll_s: float = 1.0, scheduler_poll_s: float = 0.5,
                 segment_fn: SegmentFn = train_segment) -> None:
        super().__init__(name="upscale-sweeps", daemon=True)
        self.services, self.poll_s, self.scheduler_poll_s = services, poll_s, scheduler_poll_s
        self.segment_fn = segment_fn  # the Scheduler's seam for tests
        self.stopping = threading.Event()
        self.current: str | None = None

    def run(self) -> None:
        ensure_ray(self.services.settings)
        while not self.stopping.is_set():
            if not self.run_next():
                self.stopping.wait(self.poll_s)

    def run_next(self) -> bool:
        """Drive one sweep to its end: an orphaned one first, else a pending one; False if there was none."""
        store = self.services.store
        for sweep in store.sweeps(status="running") + store.sweeps(status="cancelling"):
            if not runner_gone(sweep):
                continue
            scheduler = self._scheduler()
            if not store.claim_sweep(sweep, scheduler.owner):
                continue  # another server adopted it first
            if sweep.status == "cancelling":
                scheduler.finish_cancelling(sweep.id)
            else:
                self._drive(scheduler, sweep.id)
            return True
        have = cluster_resources(self.services.settings)
        for sweep in store.sweeps(status="pending"):
            if sweep.runner is not None and not runner_gone(sweep):
                continue  # another server is starting it
            waiting = waiting_for(sweep, have)
            if waiting is not None:
                if sweep.error != waiting:
                    store.set_sweep(sweep.id, error=waiting)
                continue
            scheduler = self._scheduler()
            if store.claim_sweep(sweep, scheduler.owner):
                self._drive(scheduler, sweep.id)
                return True
        return False

    def _scheduler(self) -> Scheduler:
        return Scheduler(self.services.store, self.services.settings, self.segment_fn, poll_s=self.scheduler_poll_s)

    def _drive(self, scheduler: Scheduler, sweep_id: str) -> None:
        store = self.services.store
        self.current = sweep_id
        try:
            scheduler.run(sweep_id)
        except Exception as e:  # a bug must not kill the loop: the sweep records it
            store.set_sweep(sweep_id, status="failed", error=traceback.format_exception_only(e)[-1].strip())
        if self.stopping.is_set() and store.sweep(sweep_id).status == "cancelled":
            store.set_sweep(sweep_id, status="pending", error=None)  # resumes on the next start
        self.current = None

    def stop(self, timeout_s: float = 60.0) -> None:
        """Cancel the running sweep's segments and wait for the loop to record it."""
        self.stopping.set()
        current = self.current
        if current is not None:
            self.services.store.request_cancel(current)
        self.join(timeout_s)


def waiting_for(sweep: SweepRecord, have: ClusterResources) -> str | None:
    """Why the cluster cannot run ``sweep``'s segments now ("waiting for resources: ..."), or None if it can."""
    # check_resources reads only the spec's resources: the stored spec is not validated again here
    spec = SweepSpec.model_construct(resources=ResourcesSection.model_validate(sweep.resources))
    try:
        check_resources(spec, have)
    except SpecError as e:
        return "waiting for resources: " + "; ".join(f"{path}: {msg}" for path, msg in e.problems)
    return None
