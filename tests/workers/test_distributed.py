"""The single-process group DeepSpeed needs: it starts wherever it is launched from.

Strategy: a fresh interpreter (a process group is once per process) inherits MASTER_PORT naming a port this test
holds open, as a Ray worker inherits the variable from a CLI or test process that made its own group; the group must
still start, on a port of its own.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

CODE = """
import os, torch.distributed as dist
from upscale.workers.distributed import init_single_process
init_single_process()
print(dist.get_world_size(), os.environ["MASTER_PORT"])
"""


def test_an_inherited_busy_master_port_is_not_reused(tmp_path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = str(held.getsockname()[1])
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": busy, "RANK": "0", "WORLD_SIZE": "1"}
        out = subprocess.run([sys.executable, "-c", CODE], env=env, cwd=tmp_path, capture_output=True, text=True,
                             timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    world, port = out.stdout.splitlines()[-1].split()  # DeepSpeed prints lines of its own before
    assert world == "1" and port != busy
