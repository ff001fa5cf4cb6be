"""Embedded Ray, as `ensure_ray` starts it for `upscale serve`, listens on the loopback interface only: Ray's ports
have no authentication of their own, so nothing of it may be reachable from another host. And its session folder
(sockets, logs), which Ray makes 0777, lies inside a folder only this user may enter.

Strategy: start it in a subprocess (the test process's own Ray is left alone), run one task so worker processes
exist, then list every listening TCP socket of that process and all its descendants (GCS, raylet, the agents, the
workers, the driver's gRPC servers) with psutil."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PROBE = textwrap.dedent("""
    import json, sys
    import psutil, ray
    from upscale.orchestrator.scheduler import ensure_ray
    from upscale.orchestrator.settings import Settings

    ensure_ray(Settings(home=sys.argv[1]), num_cpus=1)
    ray.get(ray.remote(lambda: 1).remote())
    me = psutil.Process()
    listening = []
    for proc in [me, *me.children(recursive=True)]:
        try:
            listening += [[proc.name(), c.laddr.ip, c.laddr.port] for c in proc.net_connections(kind="inet")
                          if c.status == psutil.CONN_LISTEN]
        except psutil.NoSuchProcess:
            pass
    session = ray._private.worker._global_node.get_session_dir_path()
    print(json.dumps({"listening": listening, "session": session}))
    ray.shutdown()
""")

LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


@pytest.mark.slow  # ~18 s on 2 busy cores (make test stays under 10 minutes)
def test_embedded_ray_listens_on_loopback_only(tmp_path) -> None:
    out = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path)], capture_output=True, text=True, timeout=240,
                         start_new_session=True)
    assert out.returncode == 0, out.stderr[-3000:]
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    listening = probe["listening"]
    names = {name for name, _, _ in listening}
    assert {"gcs_server", "raylet"} <= names, names  # the probe saw Ray's own servers, not an empty list
    exposed = [(name, ip, port) for name, ip, port in listening if ip not in LOOPBACK]
    assert not exposed, f"Ray processes listening beyond loopback: {exposed}"
    # Ray makes its folders 0777; what keeps other users out is a private folder above them
    above = [p for p in Path(probe["session"]).parents if not p.stat().st_mode & 0o007]
    assert above and above[0].stat().st_uid == os.getuid(), probe["session"]
    assert not above[0].stat().st_mode & 0o077, oct(above[0].stat().st_mode)
