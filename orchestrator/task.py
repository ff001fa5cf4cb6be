"""The Ray task around one segment: run it in a reused worker and leave its result on disk next to its checkpoints.

While it runs, the task leaves `worker.json` in the segment's folder, and when the segment function returns it
leaves `result.json` (orchestrator/attempt_files.py says how a restarted scheduler uses them).
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable

import ray

from upscale import storage
from upscale.orchestrator.attempt_files import WORKER_FILE, finish_attempt
from upscale.orchestrator.worker_group import run_worker_group
from upscale.sweeps.segments import SegmentResult, SegmentRuntime, SegmentSpec

SegmentFn = Callable[[SegmentSpec, SegmentRuntime], SegmentResult]


def train_segment(spec: SegmentSpec, runtime: SegmentRuntime) -> SegmentResult:
    """The default segment function, `workers.segment.run_segment`, imported in the worker (keeps torch out of the
    scheduler process)."""
    from upscale.workers.segment import run_segment

    return run_segment(spec, runtime)


# max_calls=0: a worker process is reused for any number of segments, so torch/deepspeed are imported once per
# worker (~5 s each, docs/architecture.md "Measured facts"), not once per segment.
# max_retries=0: Ray would rerun a task whose worker died (3 times by default) without the store knowing; a dead
# worker must be one failed attempt, which the scheduler retries from the segment's checkpoint and counts.
@ray.remote(max_calls=0, max_retries=0)
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
