"""Keep a long-lived driver (`upscale serve`, `upscale scheduler`) alive when its local raylet dies, so that the sweep
loop can restart Ray as it does after the GCS's death.

Ray's core worker ends its whole process (QuickExit, no exception, no exit hook) when a call to its local raylet
fails and it takes the raylet for dead. It decides that from RAY_RAYLET_PID when the variable is set (is that pid
alive?), else from its own parent: the raylet counts as dead whenever the process's parent is PID 1. A server run by
systemd, under a container's init, or by `nohup` after its shell ended has PID 1 as its parent, so the first call
after the raylet died (`ray.shutdown()` in `restart_ray` says goodbye to it) ended the server.

Ray reads RAY_RAYLET_PID once, when `ray` is first imported. Set then to the driver's own pid, the raylet counts as
alive for the driver, the failed call is an error the sweep loop handles (`ray_problem`, `restart_ray`), and
`ray.shutdown()` returns. Ray's own processes are unaffected: the raylet sets the variable to its own pid for the
workers and agents it starts, so they still end with it.
"""

from __future__ import annotations

import os
import sys

RAYLET_PID_ENV = "RAY_RAYLET_PID"


def outlive_raylet() -> None:
    """Make this process, as a Ray driver, outlive its raylet; call it before anything imports Ray (RuntimeError
    otherwise: Ray would already have read the variable)."""
    if "ray._raylet" in sys.modules:
        raise RuntimeError("outlive_raylet() must run before Ray is imported: Ray reads RAY_RAYLET_PID on import")
    os.environ[RAYLET_PID_ENV] = str(os.getpid())
