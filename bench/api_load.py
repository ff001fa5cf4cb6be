"""API latency under load: GET /sweeps/{id} on a sweep of 1,000 segments at a fixed request rate, against GET
/healthz at the same rate in the same run (the baseline: the server's floor for one authenticated round trip).

The server is `upscale serve --no-scheduler` (uvicorn, one process) on a fresh SQLite store; this script is the
second process on loopback and sends an open-loop stream (one request every 1/rate s, whether or not earlier ones
have answered, so queueing shows in the tail; aiohttp, lighter than httpx's async client) for a bounded time per
endpoint, then once more with the ETag as If-None-Match (what a poller sends). Target: p99 < 50 ms, so a dashboard
polling many sweeps stays responsive.

    .venv/bin/python bench/api_load.py [--rate 200] [--seconds 10] [--segments 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import httpx
import numpy as np

from upscale.control.tokens import create_token
from upscale.control.wiring import open_services
from upscale.orchestrator.settings import Settings
from upscale.sweeps.planner import plan
from upscale.sweeps.spec import parse_spec

# 1 dense trunk, 10 dense decays, 80 upcycles and MoE trunks, 800 MoE decays, 2 scratch trunks, 30 scratch decays
TIMEOUT_S = 5.0  # a request slower than this counts as an error: the run stays bounded when the server saturates
SPEC = {"name": "load", "model": {"sizes": ["nano"]}, "moe": {"experts": [2, 4], "topk": [1]},
        "upcycling": {"methods": ["naive", "drop"], "r": [0.25, 0.5, 0.75]},
        "tokens": {"d1": [256 * i for i in range(1, 11)], "d2": [128 * i for i in range(1, 11)],
                   "scratch": [256 * i for i in range(1, 16)]},
        "train": {"context": 16, "batch_size": 4, "lr": {"dense": 3e-3, "moe": 2e-3}, "warmup_tokens": 64},
        "resources": {"cpus": 1}}


async def load(url: str, headers: dict[str, str], rate: float, seconds: float) -> tuple[np.ndarray, int, float]:
    """Open-loop: latencies (s) of the requests answered 200/304 within TIMEOUT_S, the error count, the rate sent."""
    latencies: list[float] = []
    errors = 0
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout,
                                     connector=aiohttp.TCPConnector(limit=256)) as c:
        async def one() -> None:
            nonlocal errors
            t = time.perf_counter()
            try:
                async with c.get(url) as r:
                    await r.read()
                    ok = r.status in (200, 304)
            except (aiohttp.ClientError, TimeoutError):
                ok = False
            if ok:
                latencies.append(time.perf_counter() - t)
            else:
                errors += 1

        n = int(rate * seconds)
        start = time.perf_counter()
        tasks = []
        for i in range(n):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one()))
        sent_s = time.perf_counter() - start
        await asyncio.gather(*tasks)
    return np.array(latencies), errors, n / sent_s


@contextmanager
def serving(env: Mapping[str, str], host: str = "127.0.0.1") -> Iterator[tuple[str, subprocess.Popen]]:
    """`upscale serve --no-scheduler` on a free loopback port with ``env``: its base URL and process once /healthz
    answers; terminated on the way out (killed if still busy 30 s later: what a flood left computing is not waited
    for)."""
    with socket.socket() as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([str(Path(sys.executable).parent / "upscale"), "serve", "--no-scheduler", "--host", host,
                               "--port", str(port)], env=dict(env), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    base = f"http://{host}:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline and server.poll() is None, "server did not start"
                time.sleep(0.2)
        yield base, server
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--segments", type=int, default=1000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="upscale-api-load-") as home:
        settings = Settings(home=Path(home))
        services = open_services(settings)
        p = plan(parse_spec(SPEC))
        segments = p.segments[:args.segments]  # topological order: every kept segment's parents are kept
        sweep = services.store.create_sweep("load", SPEC, SPEC["resources"], segments)
        headers = {"Authorization": f"Bearer {create_token(services.store, 'read', 'bench')}"}
        env = {**os.environ, "UPSCALE_HOME": home, "MLFLOW_TRACKING_URI": settings.mlflow_tracking_uri}
        with serving(env) as (base, _):
            detail = httpx.get(f"{base}/sweeps/{sweep.id}", headers=headers)
            assert len(detail.json()["segments"]) == len(segments)
            print(f"sweep {sweep.id}: {len(segments)} segments, GET /sweeps/{{id}} body {len(detail.content)} bytes")
            etag = {**headers, "If-None-Match": detail.headers["etag"]}
            runs = (("baseline GET /healthz", "/healthz", headers), ("ours GET /sweeps/{id}", f"/sweeps/{sweep.id}",
                    headers), ("ours, If-None-Match (304)", f"/sweeps/{sweep.id}", etag))
            for name, path, h in runs:
                asyncio.run(load(f"{base}{path}", h, args.rate, 1.0))  # warm-up
                lat, errors, achieved = asyncio.run(load(f"{base}{path}", h, args.rate, args.seconds))
                p50, p99 = (np.percentile(lat, q) * 1e3 if len(lat) else float("nan") for q in (50, 99))
                print(f"{name:<26} {len(lat)} ok, {errors} errors, {achieved:.0f} req/s sent: "
                      f"p50 {p50:.1f} ms  p99 {p99:.1f} ms")


if __name__ == "__main__":
    main()
