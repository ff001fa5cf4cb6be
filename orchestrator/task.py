"""The Ray task around one segment: run it in a reused worker and leave its result on disk next to its checkpoints.

Two files let a restarted scheduler *adopt* work its dead predecessor started instead of training it again:
`worker.json` (host and pid of the process running the segment, present only while it runs) and `result.json`
(written atomically after the segment function returns, so its presence means the segment is complete). An embedded
Ray worker can outlive its killed driver for a while and finish its task; these files make that harmless. Both go
through `upscale.storage`, so a segment folder may be a path or a URI.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path

import ray

from upscale import storage
from upscale.orchestrator.worker_group import run_worker_group
from upscale.sweeps.segments import SegmentResult, SegmentRuntime, SegmentSpec

SegmentFn = Callable[[SegmentSpec, SegmentRuntime], SegmentResult]
RESULT_FILE = "result.json"
WORKER_FILE = "worker.json"


def train_segment(spec: SegmentSpec, runtime: SegmentRuntime) -> SegmentResult:
    """The default segment function, `workers.segment.run_segment`, imported in the worker (keeps torch out of the
    scheduler process)."""
    from upscale.workers.segment import run_segment

    return run_segment(spec, runtime)


# max_calls=0: a worker process is reused for any number of segments, so torch/deepspeed are imported once per
# worker (~5 s each, DESIGN.md "Facts measured"), not once per segment.
@ray.remote(max_calls=0)
def run_segment_task(segment_fn: SegmentFn, spec: SegmentSpec, runtime: SegmentRuntime, key: str) -> dict:
    """Run ``spec`` and leave its result, filed under the segment's key ``key`` (which differs from spec.id when
    the scheduler filled in an LR found by a search), in the segment's folder. With ``runtime.workers > 1`` this
    task only drives a Ray Train worker group (orchestrator/worker_group.py), which holds the resources."""
    directory = runtime.checkpoint_dir
    storage.write_text(directory, WORKER_FILE, json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
    try:
        if runtime.workers > 1:
            result = run_worker_group(segment_fn, spec, runtime, key)
        else:
            result = finish_attempt(segment_fn(spec, runtime), spec, runtime, key)
    finally:
        storage.delete(directory, WORKER_FILE)
    return result.model_dump(mode="json")


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
