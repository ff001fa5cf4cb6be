"""The built answers of GET /sweeps/{id}, kept so a poll of an unchanged sweep costs one small query: bounded by
bytes (UPSCALE_DETAIL_CACHE_BYTES), the least recently read evicted first. Unbounded, reading 8 sweeps of 18,144
segments grew a server by 350 MB and kept it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, NamedTuple


class Detail(NamedTuple):
    version: Any  # control/sweeps.py `version`: what changes whenever the detail does
    body: bytes  # the JSON answer
    etag: str


class DetailCache:
    """Sweep id -> its built `Detail`, at most ``max_bytes`` of bodies in all; thread-safe (request threads share
    it). A body larger than the whole bound is not kept."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, Detail] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, sweep_id: str) -> Detail | None:
        with self._lock:
            found = self._entries.get(sweep_id)
            if found is not None:
                self._entries.move_to_end(sweep_id)
            return found

    def put(self, sweep_id: str, detail: Detail) -> None:
        with self._lock:
            old = self._entries.pop(sweep_id, None)
            if old is not None:
                self._bytes -= len(old.body)
            if len(detail.body) > self.max_bytes:
                return
            self._entries[sweep_id] = detail
            self._bytes += len(detail.body)
            while self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= len(evicted.body)

    @property
    def nbytes(self) -> int:
        """The bytes of bodies kept now."""
        return self._bytes
