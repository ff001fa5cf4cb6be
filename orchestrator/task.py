"""The Ray task around one segment: run it in a reused worker (one used once on GPUs) and leave its result on disk
next to its checkpoints.

While it runs, the task leaves `worker.json` in the segment's folder, and when the segment function returns it
leaves `result.json` (orchestrator/attempt_files.py says how a restarted scheduler uses them).
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable

import ray
from ray.remote_function import RemoteFunction

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


def run_segment_in_worker(segment_fn: SegmentFn, spec: SegmentSpec, runtime: SegmentRuntime, key: str) -> dict:
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


# max_calls=0: a CPU worker process is reused for any number of segments, so torch/deepspeed are imported once per
# worker (~5 s each, docs/architecture.md "Measured facts"), not once per segment. max_calls=1 (Ray's default for
# GPU tasks, which max_calls=0 overrides; `.options()` cannot set it): a worker that ran a segment on GPUs exits,
# so its CUDA context and the allocator's cached blocks do not stay on a GPU the next segment placed there expects
# free. max_retries=0: Ray would rerun a task whose worker died (3 times by default) without the store knowing; a
# dead worker must be one failed attempt, which the scheduler retries from the segment's checkpoint and counts.
run_segment_task = ray.remote(max_calls=0, max_retries=0)(run_segment_in_worker)
run_gpu_segment_task = ray.remote(max_calls=1, max_retries=0)(run_segment_in_worker)


def segment_task(workers: int, cpus: float, gpus: float) -> tuple[RemoteFunction, dict]:
    """The Ray task for one segment and its options. A task that drives a Ray Train group holds nothing itself (the
    group's workers hold the CPUs and GPUs, and end with the group); a task on GPUs runs in a worker used once."""
    if workers > 1:
        return run_segment_task, {"num_cpus": 0}
    return (run_gpu_segment_task if gpus else run_segment_task), {"num_cpus": cpus, "num_gpus": gpus}
