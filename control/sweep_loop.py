"""The sweep loop of `upscale serve` / `upscale scheduler`: run sweeps one after another on Ray.

Each sweep is driven by the orchestrator's `Scheduler`, built on the road of control/runs.py, which records itself as
the sweep's runner. On every poll the loop first makes sure Ray is up: embedded Ray whose raylet or GCS died is
restarted, a RAY_ADDRESS cluster joined anew. Then it *adopts* sweeps whose runner died (a server killed mid-sweep, or
a scheduler of this process that the infrastructure stopped): a `running` one is resumed (finished segments stay
finished, running ones resume from their checkpoint), a `cancelling` one finishes cancelling. Then it starts the
oldest pending sweep the cluster has the resources for; one that needs more (a cluster that shrank since it was
submitted) stays pending with an error saying what it waits for, and never blocks the sweeps behind it. Claiming a
sweep is a compare-and-set on its runner, so of several servers on one store only one drives a sweep.

The loop is supervised (control/supervised.py): an infrastructure failure (Ray died, a full disk, a locked store)
puts the sweep back to pending, spends none of its segments' attempts, and the loop retries with a backoff; only
any other error of a sweep marks it failed. Stopping interrupts the running sweep without cancelling it: its running
segments are released back to pending, nothing half-recorded, and the sweep goes back to pending, so the next start
resumes it.
"""

from __future__ import annotations

import logging
import traceback

from upscale.control import runs
from upscale.control.services import Services
from upscale.control.supervised import SupervisedLoop
from upscale.orchestrator.infra import is_infrastructure
from upscale.orchestrator.records import SweepRecord
from upscale.orchestrator.scheduler import Scheduler, cluster_resources, ray_problem, restart_ray, runner_gone
from upscale.orchestrator.settings import Settings
from upscale.orchestrator.task import SegmentFn, train_segment
from upscale.sweeps.resources import ClusterResources, check_resources
from upscale.sweeps.spec import ResourcesSection, SpecError, SweepSpec

log = logging.getLogger(__name__)

STUCK_AFTER_S = 600.0  # a scheduler reports progress on every pass (every poll_s): this long without one is stuck


class SweepLoop(SupervisedLoop):
    """Restarts Ray if it died, adopts orphaned sweeps, else runs the oldest pending sweep that can run, every
    ``poll_s``."""

    def __init__(self, services: Services, poll_s: float = 1.0, scheduler_poll_s: float = 0.5,
                 segment_fn: SegmentFn = train_segment) -> None:
        super().__init__("upscale-sweeps", poll_s, STUCK_AFTER_S)
        self.services, self.scheduler_poll_s = services, scheduler_poll_s
        self.segment_fn = segment_fn  # the Scheduler's seam for tests
        self.scheduler: Scheduler | None = None  # the one driving a sweep now

    def tick(self) -> bool:
        settings = self.services.settings
        problem = ray_problem(settings)
        if problem is not None:  # not started yet, or died
            log.warning("Ray: %s; starting it", problem)
            restart_ray(settings)
        return self.run_next()

    def run_next(self) -> bool:
        """Drive one sweep to its end: an orphaned one first, else a pending one; False if there was none."""
        store = self.services.store
        for sweep in store.sweeps(status="running") + store.sweeps(status="cancelling"):
            if not runner_gone(sweep):
                continue
            scheduler = self._scheduler()
            if not store.claim_sweep(sweep, scheduler.owner):
                continue  # another server adopted it first
            self._drive(scheduler, sweep.id, cancelling=sweep.status == "cancelling")
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
        return runs.scheduler(self.services, lambda _: self.beat(), segment_fn=self.segment_fn,
                              poll_s=self.scheduler_poll_s, data_roots=self.services.settings.data_root_paths)

    def _drive(self, scheduler: Scheduler, sweep_id: str, cancelling: bool = False) -> None:
        """Run (or finish cancelling) a claimed sweep; an infrastructure failure is raised to the supervisor, any
        other error is the sweep's."""
        self.scheduler = scheduler
        if self.stopping.is_set():  # `stop` ran before this scheduler was visible to it
            scheduler.interrupt()
        try:
            if cancelling:
                scheduler.finish_cancelling(sweep_id)
            else:
                scheduler.run(sweep_id)
        except Exception as e:
            if is_infrastructure(e) or ray_problem(self.services.settings) is not None:
                raise  # the sweep resumes when the supervisor's retry finds the infrastructure back
            log.exception("sweep %s failed", sweep_id)
            self.services.store.set_sweep(sweep_id, status="failed",
                                          error=traceback.format_exception_only(e)[-1].strip())
        finally:
            scheduler.retire()  # whatever it left running is orphaned: the next scheduler adopts it
            self.scheduler = None

    def stop(self, timeout_s: float = 60.0) -> None:
        """Interrupt the running sweep (its segments released, the sweep back to pending) and wait for the loop."""
        self.stopping.set()
        scheduler = self.scheduler
        if scheduler is not None:
            scheduler.interrupt()
        self.join(timeout_s)


def ray_health(settings: Settings) -> str | None:
    """What keeps Ray from running segments now, in a line, or None while it can: /healthz's probe, which never
    waits on a Ray that this loop is restarting."""
    return ray_problem(settings, wait=False)


def waiting_for(sweep: SweepRecord, have: ClusterResources) -> str | None:
    """Why the cluster cannot run ``sweep``'s segments now ("waiting for resources: ..."), or None if it can."""
    # check_resources reads only the spec's resources: the stored spec is not validated again here
    spec = SweepSpec.model_construct(resources=ResourcesSection.model_validate(sweep.resources))
    try:
        check_resources(spec, have)
    except SpecError as e:
        return "waiting for resources: " + "; ".join(f"{path}: {msg}" for path, msg in e.problems)
    return None
