"""Heavy requests (a fit, a refit run, a suggestion, planning a submitted or extended sweep)
run on threads of their own, never on the request threads AnyIO shares with every other route: before this, 42
concurrent fits held all 40 of those and /healthz waited minutes behind them. `HeavyPool` computes at most
UPSCALE_HEAVY_WORKERS at once with UPSCALE_HEAVY_QUEUE more waiting; one past that is answered 429 with a
Retry-After (how long the queue ahead takes at the recent pace), before any work, and so is one that waited
UPSCALE_HEAVY_WAIT_S without starting. So a heavy request is answered within that wait plus its own computing,
which the cost caps bound (docs/architecture.md, "What a request may cost"); `upscale.Client` waits that long.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from upscale.api.quotas import too_many

T = TypeVar("T")
FIRST_GUESS_S = 5.0  # a heavy request's seconds until one has been timed


class HeavyPool:
    """``workers`` threads and a queue of ``queue`` for heavy requests; `run` awaits one, or raises 429."""

    def __init__(self, workers: int, queue: int, max_wait_s: float) -> None:
        self.workers, self.queue, self.max_wait_s = workers, queue, max_wait_s
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="upscale-heavy")
        self._lock = threading.Lock()
        self._admitted = 0  # computing or waiting
        self._mean_s = FIRST_GUESS_S  # a moving mean of a request's seconds, for Retry-After

    @property
    def admitted(self) -> int:
        """Heavy requests computing or waiting now."""
        return self._admitted

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a heavy thread. A caller that disconnects stops waiting; a request already computing
        finishes (its result is recorded as if answered), one still queued is dropped."""
        with self._lock:
            if self._admitted >= self.workers + self.queue:
                raise too_many(f"the server is computing {self.workers} heavy requests (fits, refit runs, "
                               f"suggestions, sweep plans) with {self.queue} more waiting, the most it queues "
                               f"(UPSCALE_HEAVY_WORKERS, UPSCALE_HEAVY_QUEUE); retry after the Retry-After seconds",
                               self._mean_s * (self._admitted / self.workers))
            self._admitted += 1
        future = self._executor.submit(self._timed, fn, args, time.monotonic())
        future.add_done_callback(self._release)  # also when cancelled before it started
        return await asyncio.wrap_future(future)  # cancelled with the request: a queued call is dropped

    def _timed(self, fn: Callable[..., T], args: tuple[Any, ...], queued: float) -> T:
        start = time.monotonic()
        if start - queued > self.max_wait_s:
            raise too_many(f"this request waited {start - queued:.0f} s for one of the server's {self.workers} "
                           f"heavy-request threads, more than UPSCALE_HEAVY_WAIT_S={self.max_wait_s:g}; nothing was "
                           f"done: retry after the Retry-After seconds", self._mean_s)
        try:
            return fn(*args)
        finally:
            seconds = time.monotonic() - start
            with self._lock:
                self._mean_s = 0.8 * self._mean_s + 0.2 * seconds

    def _release(self, _: Future) -> None:
        with self._lock:
            self._admitted -= 1

    def shutdown(self) -> None:
        """Drop what waits; what computes finishes."""
        self._executor.shutdown(wait=False, cancel_futures=True)
