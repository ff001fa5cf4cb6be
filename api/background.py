"""The sweep loop of `upscale serve` / `upscale scheduler`: run pending sweeps one after another on Ray.

Each sweep is driven by the orchestrator's `Scheduler`. Stopping asks the running sweep to cancel (its running
segments are released back to pending, nothing half-recorded) and puts it back to pending, so the next start resumes
it instead of leaving it cancelled.
"""

from __future__ import annotations

import threading
import traceback

from upscale.api.services import Services
from upscale.orchestrator.scheduler import Scheduler, ensure_ray


class SweepLoop(threading.Thread):
    """Picks the oldest pending sweep every ``poll_s`` and runs it to its end."""

    def __init__(self, services: Services, poll_s: float = 1.0, scheduler_poll_s: float = 0.5) -> None:
        super().__init__(name="upscale-sweeps", daemon=True)
        self.services, self.poll_s, self.scheduler_poll_s = services, poll_s, scheduler_poll_s
        self.stopping = threading.Event()
        self.current: str | None = None

    def run(self) -> None:
        store = self.services.store
        ensure_ray(self.services.settings)
        while not self.stopping.is_set():
            pending = store.sweeps(status="pending")
            if not pending:
                self.stopping.wait(self.poll_s)
                continue
            self.current = pending[0].id
            try:
                Scheduler(store, self.services.settings, poll_s=self.scheduler_poll_s).run(self.current)
            except Exception as e:  # a bug must not kill the loop: the sweep records it
                store.set_sweep(self.current, status="failed", error=traceback.format_exception_only(e)[-1].strip())
            if self.stopping.is_set() and store.sweep(self.current).status == "cancelled":
                store.set_sweep(self.current, status="pending", error=None)  # resumes on the next start
            self.current = None

    def stop(self, timeout_s: float = 60.0) -> None:
        """Cancel the running sweep's segments and wait for the loop to record it."""
        self.stopping.set()
        current = self.current
        if current is not None:
            self.services.store.request_cancel(current)
        self.join(timeout_s)
