"""Analyses a request asked for run here, off the server's request threads: POST /sweeps/{id}/analysis claims the
row and answers at once (202), and one of these daemon threads does the work. Bounded twice: each token name may
have PER_OWNER requested analyses running (TooManyAnalyses, HTTP 429, past that, before anything is written), and
at most SLOTS compute at once (the rest wait their turn, `running`). Stopping (the server's shutdown,
control/analyses.py `stop_requested`) ends their rows failed, "interrupted" (the analysis loop runs them again), and
the threads at their next progress step.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

PER_OWNER = 2  # requested analyses one token name may have running at once
SLOTS = 2  # requested analyses computing at once: each is a core's worth of bootstrap refits

Work = Callable[[Callable[..., None]], object]  # runs a claimed analysis, given its progress callback


class Interrupted(Exception):
    """Raised into an analysis through its progress callback when its server stops: the row ends failed,
    "interrupted", and is run again."""


def stop_when(event: threading.Event) -> Callable[..., None]:
    """An analysis's progress callback that stops it (failed, interrupted) once ``event`` is set: a server
    stopping never waits for a bootstrap to end, nor leaves its row `running`."""
    def check(*_: object) -> None:
        if event.is_set():
            raise Interrupted("the server stopped while it ran")
    return check


class TooManyAnalyses(RuntimeError):
    """The owner has as many requested analyses running as allowed: HTTP 429."""


class AnalysisJobs:
    def __init__(self, per_owner: int = PER_OWNER, slots: int = SLOTS) -> None:
        self.per_owner = per_owner
        self.running: Counter[str] = Counter()  # owner -> requested analyses reserved or running
        self.lock = threading.Lock()
        self.slots = threading.Semaphore(slots)
        self.stopping = threading.Event()

    @contextmanager
    def reserve(self, owner: str) -> Iterator[Callable[[Work], None]]:
        """A place for one of ``owner``'s analyses (TooManyAnalyses if there is none), as a function that starts
        the work; the place is given back at the block's end unless work was started in it."""
        with self.lock:
            if self.running[owner] >= self.per_owner:
                raise TooManyAnalyses(
                    f"{owner} has {self.running[owner]} requested analyses running, the most one token name may "
                    f"have at once: ask again when one has finished (GET /analyses?status=running lists them)")
            self.running[owner] += 1
        started = False

        def start(work: Work) -> None:
            nonlocal started
            threading.Thread(target=self._run, args=(owner, work), name=f"upscale-analysis-{owner}",
                             daemon=True).start()
            started = True

        try:
            yield start
        finally:
            if not started:
                self._release(owner)

    def _run(self, owner: str, work: Work) -> None:
        try:
            with self.slots:
                work(stop_when(self.stopping))
        except Exception as e:  # the row holds the error (control/analyses.py `_Work.run`)
            log.warning("requested analysis of %s ended: %s", owner, e)
        finally:
            self._release(owner)

    def _release(self, owner: str) -> None:
        with self.lock:
            self.running[owner] -= 1

    def stop(self) -> None:
        """The server is stopping: the threads stop at their next progress step (control/analyses.py
        `stop_requested` also ends their rows)."""
        self.stopping.set()
