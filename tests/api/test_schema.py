"""Schemathesis over the live server's OpenAPI schema: generated requests (with a write token) to every operation
must never produce a 5xx. Bounded: a few examples per operation, one worker, no background loops (nothing trains)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_openapi_documents_every_route(live) -> None:
    import httpx

    schema = httpx.get(f"{live.url}/openapi.json").json()
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            assert op.get("summary") and op.get("description"), f"{method.upper()} {path} undocumented"
            assert "200" in op["responses"] or "201" in op["responses"] or "204" in op["responses"]
    assert "HTTPBearer" in schema["components"]["securitySchemes"]


def test_schemathesis_finds_no_server_error(live) -> None:
    st = Path(sys.executable).parent / "schemathesis"
    run = subprocess.run(
        [str(st), "run", f"{live.url}/openapi.json", "--checks", "not_a_server_error", "--max-examples", "8",
         "--phases", "examples,fuzzing", "--workers", "1", "--request-timeout", "30",
         "-H", f"Authorization: {live.write['Authorization']}", "--generation-deterministic"],
        capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
