"""Supervised background work: the thread every loop of `upscale serve` runs in (sweeps, refits, analyses).

A loop calls its `tick` every ``interval_s``, and at once again when a tick says there is more to do. No exception
ends the thread: a tick that raises is logged with its traceback and recorded (`last_error`), and the next try waits
an exponential backoff (``interval_s`` doubled per consecutive failure, at most MAX_BACKOFF_S); a tick that succeeds
resets it. So a full disk, a locked store or a dead Ray costs retries, never the loop.

`health()` is what /healthz reports of each loop: whether its thread lives, when it last showed progress (a tick
ended, or work inside a long tick called `beat`), its consecutive failures and the type of its last error. A loop
is *down* when its thread has died or it has shown no progress for ``stuck_after_s``.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from typing import Any

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 60.0


class SupervisedLoop(threading.Thread):
    """A daemon thread running `tick` until `stop`, surviving whatever a tick raises; subclasses define `tick`."""

    def __init__(self, name: str, interval_s: float, stuck_after_s: float) -> None:
        super().__init__(name=name, daemon=True)
        self.interval_s, self.stuck_after_s = interval_s, stuck_after_s
        self.stopping = threading.Event()
        self.failures = 0  # consecutive failed ticks
        self.last_error: str | None = None
        self.last_beat = time.monotonic()

    def tick(self) -> bool | None:
        """One iteration of the loop's work; True when there is more to do at once (no wait before the next)."""
        raise NotImplementedError

    def run(self) -> None:
        wait = self.interval_s
        while not self.stopping.wait(wait):
            try:
                busy = self.tick()
            except Exception as e:  # nothing ends a supervised loop: log, back off, retry
                self.failures += 1
                self.last_error = traceback.format_exception_only(e)[-1].strip()[:2000]
                wait = min(self.interval_s * 2 ** self.failures, MAX_BACKOFF_S)
                log.exception("%s: iteration failed (%d in a row); retrying in %.0f s", self.name, self.failures,
                              wait)
            else:
                self.failures, self.last_error = 0, None
                wait = 0.0 if busy else self.interval_s
            self.beat()

    def beat(self) -> None:
        """The loop makes progress (called by long ticks, e.g. on every pass of a sweep's scheduler)."""
        self.last_beat = time.monotonic()

    def stop(self) -> None:
        self.stopping.set()

    def down(self) -> str | None:
        """Why the loop does not work (its thread died, or it is stuck), or None while it runs."""
        if not self.is_alive():
            return "its thread has died" if not self.stopping.is_set() else "stopped"
        quiet = time.monotonic() - self.last_beat
        if quiet > self.stuck_after_s:
            return f"stuck: no progress for {quiet:.0f} s"
        return None

    def health(self) -> dict[str, Any]:
        """The loop as /healthz shows it, to anyone: of its last error only the type (the log has the rest, which
        may name paths or SQL)."""
        problem = self.down()
        return {"ok": problem is None, "problem": problem, "alive": self.is_alive(),
                "last_progress_s_ago": round(time.monotonic() - self.last_beat, 1),
                "consecutive_failures": self.failures,
                "last_error": self.last_error.split(":")[0] if self.last_error else None}
