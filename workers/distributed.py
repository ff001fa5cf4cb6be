"""A single-process torch.distributed group for DeepSpeed on one machine (tests, CPU training, the CLI).

DeepSpeed's engine and expert-parallel groups need an initialised process group even with one process; a bare
`MoE` layer with ep_size=1 does not. `init_single_process` is idempotent and picks a free port, so tests and jobs
can call it without coordinating. The first call on a fresh machine JIT-builds DeepSpeed's small CPU comm op
(~30 s, cached in ~/.cache/torch_extensions).
"""

from __future__ import annotations

import os
import socket


def free_port() -> int:
    """A TCP port nobody listens on right now (bind to port 0 and let the OS choose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_single_process(backend: str = "gloo") -> None:
    """Initialise a world of size 1 through deepspeed.init_distributed; a no-op if a group already exists."""
    import deepspeed
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1",
           "LOCAL_RANK": "0"}
    for k, v in env.items():
        os.environ.setdefault(k, v)
    deepspeed.init_distributed(dist_backend=backend, verbose=False)
