"""A flood of half-sent requests leaves `upscale serve` whole: its open file descriptors stay within the connection
limit (one more connection is closed at once), a half-sent request is closed after the header timeout, the sweeps
queued in its store stay queued (not failed because the store could not be opened), and once the flood ends the
server answers /healthz.

Strategy: a real `upscale serve` (uvicorn, the sweep loop, embedded Ray) in its own session on a real SQLite store,
with its limits lowered by its command-line options; two sweeps wait in the store for a GPU the cluster does not
have, so the sweep loop keeps reading them through the flood. A thread opens a few thousand connections that each
send half a request's headers and hold on; the server's descriptors are counted in /proc while it runs."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from contextlib import suppress

import httpx

from tests.api.conftest import free_port
from tests.api.test_recovery import UPSCALE, _answers, kill, wait_for
from tests.orchestrator.conftest import TINY_SPEC
from upscale.orchestrator.settings import Settings
from upscale.orchestrator.store import Store
from upscale.sweeps.loader import load_spec
from upscale.sweeps.planner import plan

CONNECTION_LIMIT = 64
FLOOD = 3000
HALF_A_REQUEST = b"GET /healthz HTTP/1.1\r\nHost: upscale\r\nX-Slow: "  # the headers never end


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def flood(port: int, held: list[socket.socket], stop: threading.Event) -> None:
    """Open FLOOD connections that each send half a request and hold on (until the server closes them)."""
    for _ in range(FLOOD):
        if stop.is_set():
            return
        s = socket.socket()
        s.settimeout(2)
        try:
            s.connect(("127.0.0.1", port))
            s.sendall(HALF_A_REQUEST)
        except OSError:  # refused or reset: the server is shedding them
            s.close()
            continue
        held.append(s)


def test_a_flood_of_half_sent_requests_leaves_the_server_and_its_queued_sweeps_whole(tmp_path, mlflow_uri) -> None:
    settings = Settings(home=tmp_path / "home", mlflow_tracking_uri=mlflow_uri)
    store = Store(settings.db_url)
    spec = load_spec(TINY_SPEC)
    waiting = {store.create_sweep(f"queued-{i}", spec.model_dump(mode="json"), {"cpus": 1, "gpus": 1, "workers": 1},
                                  plan(spec).segments).id for i in range(2)}  # a GPU the cluster lacks: they wait
    port, log = free_port(), tmp_path / "serve.log"
    env = {**os.environ, "UPSCALE_HOME": str(settings.home), "MLFLOW_TRACKING_URI": mlflow_uri}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen([str(UPSCALE), "serve", "--host", "127.0.0.1", "--port", str(port),
                             "--connection-limit", str(CONNECTION_LIMIT), "--header-timeout", "1"],
                            env=env, start_new_session=True, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    held: list[socket.socket] = []
    stop = threading.Event()
    try:
        wait_for(lambda: _answers(url), 240, "the server to answer", proc, log)
        wait_for(lambda: all(store.sweep(s).error for s in waiting), 60, "the sweep loop to read the queue",
                 proc, log)

        # one half-sent request alone is closed by the server once its headers are overdue
        with socket.create_connection(("127.0.0.1", port), timeout=30) as slow:
            slow.sendall(HALF_A_REQUEST)
            assert slow.recv(1024) == b""  # EOF from the server, not a timeout here

        baseline = open_fds(proc.pid)
        attacker = threading.Thread(target=flood, args=(port, held, stop), daemon=True)
        attacker.start()
        most = baseline
        while attacker.is_alive():
            most = max(most, open_fds(proc.pid))
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.02)
        assert len(held) >= CONNECTION_LIMIT  # the flood did reach the server
        assert most <= baseline + CONNECTION_LIMIT + 16, (most, baseline)  # bounded by the limit, not by the flood

        for s in held:
            s.close()
        held.clear()
        wait_for(lambda: _answers(url), 30, "the server to answer after the flood", proc, log)
        with httpx.Client(timeout=10) as c:
            assert c.get(f"{url}/healthz").status_code == 200
        for sweep_id in waiting:  # still queued: the store stayed readable to the sweep loop through it all
            sweep = store.sweep(sweep_id)
            assert sweep.status == "pending" and sweep.error.startswith("waiting for resources"), sweep.error
    finally:
        stop.set()
        for s in held:
            with suppress(OSError):
                s.close()
        kill(proc)
