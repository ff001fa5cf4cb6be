"""A real uvicorn server on a free loopback port, in a thread of the test process, on a real SQLite store and a real
MLflow SQLite store under a temporary UPSCALE_HOME; tokens are created in that store the way `upscale token create`
does. Ray is embedded (2 CPUs, as the machine has) and started from the main thread. `postgres_url` (a fresh database
on the PostgreSQL test server, tests/deploy/conftest.py) serves the tests that run a server on PostgreSQL too."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from tests.deploy.conftest import postgres_url  # noqa: F401  (a fixture: a fresh database on the test server)
from upscale.api.app import create_app
from upscale.api.connections import server_options
from upscale.control.tokens import create_token
from upscale.orchestrator.settings import Settings


@dataclass
class Live:
    url: str
    settings: Settings
    write: dict[str, str]  # headers with a write token
    read: dict[str, str]  # headers with a read token
    app: FastAPI  # the app being served, for tests of its routes

    def client(self, headers: dict[str, str] | None = None) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=headers if headers is not None else self.write, timeout=120)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve(settings: Settings, bounded: bool = False, **options) -> Iterator[Live]:
    """Run `create_app(settings, **options)` under uvicorn until the block ends (graceful shutdown); ``bounded``:
    with the connection bounds `upscale serve` runs with (api/connections.py `server_options`)."""
    app = create_app(settings, **options)
    store = app.state.services.store
    write = {"Authorization": f"Bearer {create_token(store, 'write', 'alice')}"}
    read = {"Authorization": f"Bearer {create_token(store, 'read', 'bob')}"}
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           **(server_options(settings) if bounded else {})))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield Live(f"http://127.0.0.1:{port}", settings, write, read, app)
    finally:
        server.should_exit = True
        thread.join(90)


@pytest.fixture(scope="module")
def live(tmp_path_factory, mlflow_uri) -> Iterator[Live]:
    """A server without the background loops: for auth, validation and schema tests."""
    settings = Settings(home=tmp_path_factory.mktemp("home"), mlflow_tracking_uri=mlflow_uri)
    with serve(settings, scheduler=False) as server:
        yield server
