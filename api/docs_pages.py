"""The API's own description pages (/docs, /redoc) load nothing from outside the server.

Their scripts and styles are bundled (fastapi-offline), but ReDoc's sidebar draws the "API docs by Redocly" logo
from Redocly's CDN, which a user's browser would fetch, and fail to fetch offline. A Content-Security-Policy on the
pages keeps every fetch on this server: the browser never requests the logo (the link's text stays). Inline scripts
and styles are allowed (Swagger UI is started by one, ReDoc styles itself inline), and ReDoc's search runs in a
worker made from a blob.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

PAGES = ("/docs", "/docs/oauth2-redirect", "/redoc")
POLICY = ("default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
          "img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; connect-src 'self'")


class SameOriginDocs:
    """Adds `POLICY` as the Content-Security-Policy of the `PAGES`' responses."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in PAGES:
            await self.app(scope, receive, send)
            return

        async def with_policy(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []),
                                      (b"content-security-policy", POLICY.encode())]
            await send(message)

        await self.app(scope, receive, with_policy)
