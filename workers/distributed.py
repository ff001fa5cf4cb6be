"""A single-process torch.distributed group for DeepSpeed on one machine (tests, CPU training, the CLI).

DeepSpeed's engine and expert-parallel groups need an initialised process group even with one process; a bare
`MoE` layer with ep_size=1 does not. `init_single_process` is idempotent and picks a free port, so tests and jobs
can call it without coordinating. The first call on a fresh machine JIT-builds DeepSpeed's small CPU comm op
(~30 s, cached in ~/.cache/torch_extensions); `make venv` builds it at install (`build_pending_op`), so that neither
the first test nor the first segment waits on the compiler.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
from pathlib import Path


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
    # Set, not defaulted: a world of one has no peer to agree a port with, and a MASTER_PORT inherited from the
    # process that started this one (a CLI or test process that made its own group) is that process's busy port.
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1",
           "LOCAL_RANK": "0"}
    os.environ.update(env)
    deepspeed.init_distributed(dist_backend=backend, verbose=False)


# The op DeepSpeed's CPU accelerator JIT-compiles (C++, minutes) the first time a process initialises its
# distributed backend; torch's cpp_extension caches the build, so it happens once per machine and Python/torch build.
SHM_OP = "deepspeed_shm_comm"


def pending_op_build() -> Path | None:
    """The folder where DeepSpeed will compile its shared-memory op at the next start of training, if it has not been
    compiled yet; None when it has, or when nothing will be (a CUDA machine, not Linux, an install with ops built)."""
    import torch
    from torch.utils.cpp_extension import get_default_build_root

    accelerator = os.environ.get("DS_ACCELERATOR") or ("cuda" if torch.cuda.is_available() else "cpu")
    deepspeed = importlib.util.find_spec("deepspeed")
    if sys.platform != "linux" or accelerator != "cpu" or deepspeed is None or deepspeed.origin is None:
        return None
    if any((Path(deepspeed.origin).parent / "ops" / "comm").glob(f"{SHM_OP}_op*.so")):  # built at install time
        return None
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is None:  # torch.utils.cpp_extension's layout: <cache>/py<version>_<accelerator>/<name>
        gpu = (f"rocm{torch.version.hip.replace('.', '')}" if torch.version.hip else
               f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu")
        root = str(Path(get_default_build_root()) / f"py{sys.version_info.major}{sys.version_info.minor}"
                   f"{getattr(sys, 'abiflags', '')}_{gpu}")
    folder = Path(root) / SHM_OP
    return None if (folder / f"{SHM_OP}.so").exists() else folder


def build_pending_op() -> bool:
    """Compile DeepSpeed's shared-memory op now, where the next start of training would (``pending_op_build``),
    through the very function DeepSpeed's backend calls at that start, so the build lands in the cache it reads; True
    if it compiled something."""
    if pending_op_build() is None:
        return False
    from deepspeed.comm.torch import build_shm_op

    return build_shm_op() is not None
