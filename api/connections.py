"""What bounds the connections `upscale serve` holds, so a flood of them cannot take the process's file descriptors
(and with them the state store, which the background loops must keep opening).

uvicorn bounds requests (`limit_concurrency`: one past it is answered 503) and idle keep-alive connections
(`timeout_keep_alive`), but not connections that never finish sending a request: a client that sends half a header
holds its socket, and a file descriptor, for ever. `bounded_protocol` is uvicorn's h11 protocol with the two bounds
that needs: at most `connection_limit` connections open (one more is closed as soon as it is accepted) and
`header_timeout_s` for a request's headers to arrive, counted from the connection (or from the end of the previous
response), after which the connection is closed. A request answered before its body ended (no valid token, a body
too slow or too large: api/request_guards.py) has its connection closed DRAIN_S later: the rest of the body is
never read, so the client cannot hold the connection by trickling it; the delay lets a client that sent its body
at once see the answer instead of a reset.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from upscale.orchestrator.settings import Settings

DRAIN_S = 0.5  # what a connection answered before its body ended keeps reading (and dropping) before it is closed


class _BoundedH11Protocol(H11Protocol):
    """H11Protocol with a connection cap and a header deadline (the class attributes `bounded_protocol` sets)."""

    connection_limit = 0
    header_timeout_s = 0.0
    _header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.connection_limit:
            transport.abort()  # connection_lost follows and forgets it: the descriptor is freed now
            return
        self._await_headers()

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request's headers arrived: its body and its answer have their own limits
            self._stop_waiting()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing():
            return
        if self.conn.their_state is h11.SEND_BODY:  # answered before its body ended (401, 408, 413): close soon
            self._await_headers(min(DRAIN_S, self.header_timeout_s))
        else:
            self._await_headers()  # a kept-alive connection: the next request's headers are due in time too

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_waiting()
        super().connection_lost(exc)

    def _await_headers(self, seconds: float | None = None) -> None:
        self._stop_waiting()
        self._header_deadline = self.loop.call_later(seconds or self.header_timeout_s, self._headers_too_slow)

    def _stop_waiting(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        if self.cycle is None or self.cycle.response_complete:  # no request under way: nothing to answer
            self.transport.close()


def bounded_protocol(connection_limit: int, header_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, closing a connection past ``connection_limit`` at once and one whose request headers
    have not arrived ``header_timeout_s`` after it opened (or after its previous response)."""
    return type("BoundedH11Protocol", (_BoundedH11Protocol,),
                {"connection_limit": connection_limit, "header_timeout_s": header_timeout_s})


def server_options(settings: Settings) -> dict[str, Any]:
    """The `uvicorn.run` keyword arguments that bound what connections can cost, from ``settings``."""
    return {"http": bounded_protocol(settings.connection_limit, settings.header_timeout_s),
            "limit_concurrency": settings.connection_limit, "backlog": settings.backlog,
            "timeout_keep_alive": settings.keep_alive_s}
