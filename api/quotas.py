"""Per-token quotas of the REST API: what one token name may have the server do at once or per minute, refused with
429 and a Retry-After before the work starts (docs/architecture.md, "What a request may cost").

Sweeps in flight (pending or running) are counted in the store, in the transaction that records a sweep, so
every server sharing it counts alike and racing submissions cannot pass it (control/sweeps.py `within_quota`;
api/app.py answers its refusal with 429 and IN_FLIGHT_RETRY_S). Fits and analyses per minute are counted in this
process over a sliding 60 s window, on purpose: they bound what this process computes (its heavy-request threads,
api/heavy.py, bound it at any instant), so a deployment of several servers allows that many per server, and a
restart starts the window afresh.
The in-process CLI never comes here: it holds the database itself and is not limited.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque

from fastapi import HTTPException

WINDOW_S = 60.0
IN_FLIGHT_RETRY_S = 60  # what Retry-After says of a sweep quota: a sweep's segments take about this long at least


def too_many(message: str, retry_after_s: float) -> HTTPException:
    return HTTPException(429, message, headers={"Retry-After": str(max(1, math.ceil(retry_after_s)))})


class PerMinute:
    """At most ``limit`` calls per name in any WINDOW_S seconds: `take` counts one call or raises 429."""

    def __init__(self, what: str, limit: int, setting: str) -> None:
        self.what, self.limit, self.setting = what, limit, setting
        self._calls: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def take(self, name: str) -> None:
        now = time.monotonic()
        with self._lock:
            calls = self._calls.setdefault(name, deque())
            while calls and calls[0] <= now - WINDOW_S:
                calls.popleft()
            if len(calls) >= self.limit:
                raise too_many(f"token {name!r} has made {len(calls)} {self.what} in the last minute, the most this "
                               f"server allows ({self.setting}={self.limit}); retry after the Retry-After seconds",
                               calls[0] + WINDOW_S - now)
            calls.append(now)
