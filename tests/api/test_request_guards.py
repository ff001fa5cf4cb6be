"""A body is read only from a caller with a valid token, and only for so long: on a real uvicorn server with the
bounds `upscale serve` runs with, on loopback, raw sockets send a `POST /fits` whose headers promise 100,000 bytes
and then trickle them. Without a token it is answered 401 (a read token: 403) from its headers, and the connection
is closed; with a write token the body must arrive within UPSCALE_BODY_TIMEOUT_S (408 otherwise). A caller that
sends its whole body at once still gets its answer, not a reset. No background loops: nothing trains."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from tests.api.conftest import Live, serve
from upscale.orchestrator.settings import Settings

PROMISED = 100_000


@pytest.fixture(scope="module")
def server(tmp_path_factory, mlflow_uri) -> Iterator[Live]:
    settings = Settings(home=tmp_path_factory.mktemp("home"), mlflow_tracking_uri=mlflow_uri, body_timeout_s=1.0,
                        header_timeout_s=30.0)
    with serve(settings, bounded=True, scheduler=False) as live:
        yield live


def _connect(live: Live) -> socket.socket:
    host, port = live.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=20)  # a hang fails the test, it does not stall it


def _head(headers: dict[str, str], length: int = PROMISED) -> bytes:
    lines = ["POST /fits HTTP/1.1", "Host: upscale", "Content-Type: application/json", f"Content-Length: {length}",
             *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _answer(s: socket.socket) -> tuple[int, dict]:
    """The status and JSON body of the response on ``s``."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    while len(body) < length:
        body += s.recv(65536)
    return int(head.split()[1]), json.loads(body)


@pytest.mark.parametrize("who", ["nobody", "a bad token", "a read token"])
def test_a_trickled_body_without_write_rights_is_refused_from_its_headers(server, who) -> None:
    headers = {"nobody": {}, "a bad token": {"Authorization": "Bearer ups_not-a-token"},
               "a read token": server.read}[who]
    with _connect(server) as s:
        s.sendall(_head(headers) + b"{")  # one byte of the 100,000 promised; the rest never comes
        status, body = _answer(s)  # answered without waiting for the body
        assert s.recv(1) == b""  # and closed by the server: the client cannot hold it by trickling
    if who == "a read token":
        assert status == 403 and body["detail"] == "token 'bob' has scope 'read'; this needs 'write'"
    else:
        assert status == 401 and body["detail"] == "missing, unknown, revoked or expired bearer token"


def test_a_body_slower_than_the_deadline_is_408_even_with_a_token(server) -> None:
    with _connect(server) as s:
        s.sendall(_head(server.write) + b"{")
        status, body = _answer(s)
        assert s.recv(1) == b""
    assert status == 408 and "UPSCALE_BODY_TIMEOUT_S" in body["detail"]


def test_a_whole_body_sent_at_once_gets_its_answer(server) -> None:
    rows = [{"N1": 1e8, "D1": 1e9, "D2": 1e9 + i, "loss": 3.0} for i in range(2000)]
    body = json.dumps({"law": "joint", "kind": "upcycled", "rows": rows}).encode()
    assert len(body) > PROMISED
    for headers, status in (({}, 401), (server.write, 422)):  # refused unread, or read and fitted: too few N1
        with _connect(server) as s:
            s.sendall(_head(headers, len(body)) + body)
            assert _answer(s)[0] == status
