"""The files an attempt leaves in its segment's folder, read by a restarted scheduler to *adopt* work its dead
predecessor started instead of training it again.

`worker.json` (host and pid of the process running the segment, present only while it runs) and `result.json`
(written atomically after the segment function returns, so its presence means the segment is complete). An embedded
Ray worker can outlive its killed driver for a while and finish its task; these files make that harmless. Both go
through `upscale.storage`, so a segment folder may be a path or a URI. The single-process task
(orchestrator/task.py) and rank 0 of a worker group (orchestrator/worker_group.py) write them the same way.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from upscale import storage
from upscale.sweeps.segments import SegmentResult, SegmentRuntime, SegmentSpec

RESULT_FILE = "result.json"
WORKER_FILE = "worker.json"


def finish_attempt(result: SegmentResult, spec: SegmentSpec, runtime: SegmentRuntime, key: str) -> SegmentResult:
    """File a segment function's result under the segment's key in its folder (its presence = the attempt is done)."""
    if result.segment_id != spec.id:
        raise ValueError(f"segment function returned the result of {result.segment_id} for {spec.id}")
    result = result.model_copy(update={"segment_id": key})
    write_result(runtime.checkpoint_dir, result)
    return result


def write_result(directory: str | Path, result: SegmentResult) -> None:
    storage.write_text(directory, RESULT_FILE, json.dumps(result.model_dump(mode="json")))


def read_result(directory: str | Path, segment_id: str) -> SegmentResult | None:
    """The result a finished attempt left in ``directory``, if it is there and belongs to ``segment_id``."""
    text = storage.read_text(directory, RESULT_FILE)
    if text is None:
        return None
    result = SegmentResult.model_validate_json(text)
    return result if result.segment_id == segment_id else None


def worker_running(directory: str | Path) -> bool:
    """Whether a process on this host is still running the segment in ``directory`` (another host: unknown, False;
    on a cluster Ray itself kills the tasks of a dead driver)."""
    try:
        worker = json.loads(storage.read_text(directory, WORKER_FILE) or "")
    except json.JSONDecodeError:
        return False
    if worker.get("host") != socket.gethostname():
        return False
    return pid_alive(int(worker["pid"]))


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` on this host exists (signal 0 probes without sending; EPERM means it exists)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
