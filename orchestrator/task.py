"""The Ray task around one segment: run it in a reused worker and leave its result on disk next to its checkpoints.

The result file is what lets a restarted scheduler *adopt* a segment that finished while its scheduler was dead,
instead of training it again. It is written atomically (temp file + rename) after the segment function returns, so
its presence means the segment is complete.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import ray

from sweeps.segments import SegmentResult, SegmentRuntime, SegmentSpec

SegmentFn = Callable[[SegmentSpec, SegmentRuntime], SegmentResult]
RESULT_FILE = "result.json"


def train_segment(spec: SegmentSpec, runtime: SegmentRuntime) -> SegmentResult:
    """The default segment function, `workers.segment.run_segment`, imported in the worker (keeps torch out of the
    scheduler process)."""
    from workers.segment import run_segment

    return run_segment(spec, runtime)


# max_calls=0: a worker process is reused for any number of segments, so torch/deepspeed are imported once per
# worker (~5 s each, DESIGN.md "Facts measured"), not once per segment.
@ray.remote(max_calls=0)
def run_segment_task(segment_fn: SegmentFn, spec: SegmentSpec, runtime: SegmentRuntime) -> dict:
    result = segment_fn(spec, runtime)
    if result.segment_id != spec.id:
        raise ValueError(f"segment function returned the result of {result.segment_id} for {spec.id}")
    write_result(Path(runtime.checkpoint_dir), result)
    return result.model_dump(mode="json")


def write_result(directory: Path, result: SegmentResult) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{RESULT_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps(result.model_dump(mode="json")))
    tmp.replace(directory / RESULT_FILE)


def read_result(directory: Path, segment_id: str) -> SegmentResult | None:
    """The result a finished attempt left in ``directory``, if it is there and belongs to ``segment_id``."""
    path = directory / RESULT_FILE
    if not path.is_file():
        return None
    result = SegmentResult.model_validate_json(path.read_text())
    return result if result.segment_id == segment_id else None
