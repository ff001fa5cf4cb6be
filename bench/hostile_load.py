"""The API under the hostile shapes a reliability probe found: do /healthz and GET /sweeps stay fast, and is any
legitimate request refused, while one token floods fits, while connections trickle bodies without a token, and
while parallel submissions race the in-flight quota?

The server is `upscale serve --no-scheduler` (uvicorn, one process) on a fresh SQLite store, listening on 127.0.0.1
only; this script is the second process. Each scenario runs for --seconds while two probes send GET /healthz and GET
/sweeps (read token) every 0.25 s, open loop, each waiting at most PROBE_TIMEOUT_S; a probe that is not answered 200
in time counts as refused. The scenarios, run one after the other (the server idle between them):

- raced quota: --racers distinct sweeps submitted at once by one write token at UPSCALE_MAX_SWEEPS_IN_FLIGHT=3;
- slow bodies: --slow connections send `POST /fits` headers with Content-Length 100000 and no token, then one byte
  every 2 s, until the server closes them or the window ends;
- fit flood: --fits concurrent `POST /fits` (joint law, 18 inline rows, --bootstrap draws) by one write token, each
  sent again as soon as it is answered.

Everything is bounded: connections, the window, every client wait; the server is stopped at the end.

    .venv/bin/python bench/hostile_load.py [--seconds 30] [--fits 42] [--bootstrap 20] [--slow 540] [--racers 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
import time
from collections import Counter
from contextlib import suppress
from pathlib import Path

import aiohttp
import httpx
import numpy as np
from api_load import serving  # bench/api_load.py: a real `upscale serve` on a free loopback port

from upscale.control.tokens import create_token
from upscale.control.wiring import open_services
from upscale.fitting.laws import get_law
from upscale.fitting.synthetic import TABLE2, design, generate
from upscale.orchestrator.settings import Settings

HOST = "127.0.0.1"  # loopback only
PROBE_EVERY_S = 0.25
PROBE_TIMEOUT_S = 10.0
CLIENT_TIMEOUT_S = 60.0  # an attacking request is dropped after this: the run stays bounded on a stalled server
QUOTA = 3
SPEC = {"model": {"sizes": ["nano"]}, "moe": {"experts": [2], "topk": [1]}, "upcycling": {"methods": ["naive"]},
        "tokens": {"d1": [1024], "d2": [512, 1024]},
        "train": {"context": 16, "batch_size": 4, "lr": {"dense": 0.003, "moe": 0.002}, "warmup_tokens": 64}}


def fit_rows() -> list[dict]:
    """18 synthetic upcycled observations (2 N1 x 3 D1 x 3 D2) of the joint law."""
    joint = get_law("joint")
    grid = {"N1": (1e8, 1e9), "D1": (1e9, 4e9, 1.6e10), "D2": (1e9, 4e9, 1.6e10)}
    rows = generate(joint, TABLE2["upcycled"], design(joint, grid), noise=0.003, seed=4)
    return json.loads(rows.drop(columns="trunk").to_json(orient="records"))


class Probe:
    """GET ``path`` every PROBE_EVERY_S until stopped: latencies of the 200s, and what else came back."""

    def __init__(self, base: str, path: str, headers: dict[str, str]) -> None:
        self.url, self.headers = base + path, headers
        self.latencies: list[float] = []
        self.refused: Counter[str] = Counter()

    async def _one(self, session: aiohttp.ClientSession) -> None:
        t = time.perf_counter()
        try:
            async with session.get(self.url, headers=self.headers) as r:
                await r.read()
                status = r.status
        except TimeoutError:
            status = "timeout"
        except aiohttp.ClientError as e:
            status = type(e).__name__
        if status == 200:
            self.latencies.append(time.perf_counter() - t)
        else:
            self.refused[str(status)] += 1

    async def run(self, stop: asyncio.Event) -> None:
        timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
            tasks = []
            while not stop.is_set():
                tasks.append(asyncio.create_task(self._one(session)))
                with suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), PROBE_EVERY_S)
            await asyncio.gather(*tasks)

    def line(self) -> str:
        lat = np.array(self.latencies)
        p99, worst = (f"{np.percentile(lat, 99):.3f}", f"{lat.max():.3f}") if len(lat) else ("-", "-")
        refused = sum(self.refused.values())
        return f"{len(lat) + refused:>4} | {p99:>7} | {worst:>7} | {refused}" + (
            f" ({', '.join(f'{n}x {s}' for s, n in self.refused.items())})" if refused else "")


async def raced_quota(base: str, write: dict[str, str], args: argparse.Namespace, stop: asyncio.Event) -> str:
    async with aiohttp.ClientSession(headers=write, timeout=aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)) as c:
        async def submit(i: int) -> int:
            async with c.post(f"{base}/sweeps", json={**SPEC, "name": f"race-{i}"}) as r:
                return r.status
        statuses = Counter(await asyncio.gather(*(submit(i) for i in range(args.racers))))
    await stop.wait()
    return f"{statuses[201]} of {args.racers} created at a limit of {QUOTA} ({dict(statuses)})"


async def slow_bodies(base: str, _: dict[str, str], args: argparse.Namespace, stop: asyncio.Event) -> str:
    head = (f"POST /fits HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
            f"Content-Length: 100000\r\n\r\n").encode()
    answered: Counter[str] = Counter()

    async def trickle() -> bool:
        """True while the server still holds the connection at the window's end."""
        try:
            reader, writer = await asyncio.open_connection(HOST, int(base.rsplit(":", 1)[1]))
        except OSError:
            answered["not accepted"] += 1
            return False
        try:
            writer.write(head)
            while not stop.is_set():
                writer.write(b" ")
                await writer.drain()
                with suppress(TimeoutError):
                    first = await asyncio.wait_for(reader.read(12), 2.0)
                    answered[first.decode(errors="replace")[9:12] or "closed"] += 1
                    return False
            return True
        except OSError:
            answered["reset"] += 1
            return False
        finally:
            writer.close()

    held = sum(await asyncio.gather(*(trickle() for _ in range(args.slow))))
    return f"{held} of {args.slow} still held at the end; answered: {dict(answered)}"


async def fit_flood(base: str, write: dict[str, str], args: argparse.Namespace, stop: asyncio.Event) -> str:
    body = {"law": "joint", "kind": "upcycled", "rows": fit_rows(), "bootstrap": args.bootstrap}
    statuses: Counter[str] = Counter()
    seconds: list[float] = []
    async with aiohttp.ClientSession(headers=write, timeout=aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S),
                                     connector=aiohttp.TCPConnector(limit=0)) as c:
        async def client() -> None:
            while not stop.is_set():
                t = time.perf_counter()
                try:
                    async with c.post(f"{base}/fits", json=body) as r:
                        await r.read()
                        statuses[str(r.status)] += 1
                        if r.status == 201:
                            seconds.append(time.perf_counter() - t)
                        elif r.status == 429:  # what a well-behaved client does
                            await asyncio.sleep(min(float(r.headers.get("retry-after", 1)), 5.0))
                except (aiohttp.ClientError, TimeoutError) as e:
                    statuses[type(e).__name__] += 1

        flood = [asyncio.create_task(client()) for _ in range(args.fits)]
        await stop.wait()
        for task in flood:
            task.cancel()
        await asyncio.gather(*flood, return_exceptions=True)
    slowest = f", slowest 201 {max(seconds):.1f} s" if seconds else ""
    return f"answers {dict(statuses)}{slowest}"


async def scenario(base: str, read: dict[str, str], write: dict[str, str], args: argparse.Namespace,
                   attack) -> tuple[str, Probe, Probe]:
    stop = asyncio.Event()
    probes = Probe(base, "/healthz", {}), Probe(base, "/sweeps", read)
    running = [asyncio.create_task(p.run(stop)) for p in probes]
    attacking = asyncio.create_task(attack(base, write, args, stop))
    await asyncio.sleep(args.seconds)
    stop.set()
    what = await attacking
    await asyncio.gather(*running)
    return what, *probes


def wait_idle(base: str, server: subprocess.Popen, limit_s: float = 120.0) -> None:
    """Until /healthz answers within 0.2 s (the previous scenario's leftover work done), at most ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        assert server.poll() is None, "the server exited"
        try:
            t = time.perf_counter()
            if httpx.get(f"{base}/healthz", timeout=5).status_code == 200 and time.perf_counter() - t < 0.2:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--fits", type=int, default=42)
    ap.add_argument("--bootstrap", type=int, default=20)
    ap.add_argument("--slow", type=int, default=540)
    ap.add_argument("--racers", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="upscale-hostile-") as home:
        settings = Settings(home=Path(home))
        store = open_services(settings).store
        read = {"Authorization": f"Bearer {create_token(store, 'read', 'reader')}"}
        write = {"Authorization": f"Bearer {create_token(store, 'write', 'flooder')}"}
        env = {**os.environ, "UPSCALE_HOME": home, "MLFLOW_TRACKING_URI": settings.mlflow_tracking_uri,
               "UPSCALE_MAX_SWEEPS_IN_FLIGHT": str(QUOTA), "UPSCALE_MAX_FITS_PER_MINUTE": "100000"}
        env.pop("RAY_ADDRESS", None)
        with serving(env, HOST) as (base, server):
            print(f"{args.seconds:g} s per scenario; probes every {PROBE_EVERY_S} s, refused = not 200 within "
                  f"{PROBE_TIMEOUT_S:g} s")
            print("| scenario | probe | sent | p99 (s) | worst (s) | refused | the attack |")
            print("|---|---|---|---|---|---|---|")
            for name, attack in ((f"raced quota ({args.racers} submissions)", raced_quota),
                                 (f"slow bodies ({args.slow} connections)", slow_bodies),
                                 (f"fit flood ({args.fits} x bootstrap {args.bootstrap})", fit_flood)):
                wait_idle(base, server)
                what, health, listing = asyncio.run(scenario(base, read, write, args, attack))
                print(f"| {name} | /healthz | {health.line()} | {what} |")
                print(f"| | GET /sweeps | {listing.line()} | |", flush=True)


if __name__ == "__main__":
    main()
