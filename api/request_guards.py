"""What a request must show before its body is read, and how long it may take to send it: without these, 540
connections sending a `POST /fits` body a byte every few seconds, with no token, held the server's connections and
legitimate requests were refused (503).

`AuthBeforeBody` checks the bearer token of a request that may carry a body against the scope its route needs,
from the headers alone, with the routes' own 401 and 403 (api/auth.py `authorize`): no body of a caller without a
valid token is read. `BodyDeadline` gives a request UPSCALE_BODY_TIMEOUT_S from its headers to send its whole body,
then answers 408. api/connections.py closes a connection answered before its body ended, and bounds the headers'
arrival, so a request's whole time on the wire is bounded.
"""

from __future__ import annotations

from typing import Any

import anyio
from fastapi.routing import APIRoute
from fastapi.security.utils import get_authorization_scheme_param
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from upscale.api.auth import authorize
from upscale.control.tokens import SCOPES

AUTH_THREADS = 4


def _needed(dependant: Any) -> list[str]:
    """Every scope a route's dependencies require (`require`'s `required_scope`), nested ones too."""
    own = getattr(dependant.call, "required_scope", None)
    return ([own] if own else []) + [s for d in dependant.dependencies for s in _needed(d)]


class AuthBeforeBody:
    """401/403 for a request with a body, from its headers, before any of the body is read. The check is made when
    the route first asks for the body (FastAPI reads a JSON body before it solves the route's dependencies), by
    then routing has chosen the route, whose dependencies say the scope it needs. Raised from `receive`, as
    api/app.py's BodyLimit raises its 413."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        # Its own threads for the token lookups: a flood of bodies without a token waits on these, not on the
        # threads every read is answered on.
        self._threads = anyio.CapacityLimiter(AUTH_THREADS)
        self._scopes: dict[int, str | None] = {}  # id of a route (routes live as long as the app) -> its scope

    def _scope_of(self, route: APIRoute) -> str | None:
        if id(route) not in self._scopes:
            needed = _needed(route.dependant)
            self._scopes[id(route)] = max(needed, key=SCOPES.index) if needed else None
        return self._scopes[id(route)]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope["headers"]) if scope["type"] == "http" else {}
        if headers.get(b"content-length", b"0") == b"0" and b"transfer-encoding" not in headers:
            await self.app(scope, receive, send)  # no body to guard
            return
        checked = False

        async def authorized() -> Message:
            nonlocal checked
            if not checked:
                checked = True
                route = scope.get("route")
                needed = self._scope_of(route) if isinstance(route, APIRoute) else None
                if needed is not None:
                    scheme, token = get_authorization_scheme_param(headers.get(b"authorization", b"").decode("latin-1"))
                    await anyio.to_thread.run_sync(authorize, scope["app"].state.services,
                                                   token if scheme.lower() == "bearer" else None, needed,
                                                   limiter=self._threads)
            return await receive()

        await self.app(scope, authorized, send)


class BodyDeadline:
    """408 when a request's body has not all arrived ``seconds`` after its headers. Raised from `receive`, as
    api/app.py's BodyLimit raises its 413; once the body is complete, `receive` is no longer timed."""

    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app, self.seconds = app, seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = anyio.current_time() + self.seconds
        complete = False

        async def timed() -> Message:
            nonlocal complete
            if complete:
                return await receive()
            with anyio.move_on_after(deadline - anyio.current_time()):
                message = await receive()
                complete = not message.get("more_body", False)
                return message
            raise HTTPException(408, f"the request body did not arrive within {self.seconds:g} s of its headers "
                                     f"(UPSCALE_BODY_TIMEOUT_S): send it whole, at once")

        await self.app(scope, timed, send)
