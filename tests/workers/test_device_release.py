"""A finished segment on CUDA leaves nothing of its engine or model behind in the worker process, and the caching
allocator is emptied: with automatic garbage collection off, as it would be between two of its passes, no model
object is left once run_segment returns, so the GPU memory is free for the next segment in the process. Runs under
`pytest -m gpu` (bench/gpu_check.py's pytest step)."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

from upscale.sweeps.segments import DataSpec, ModelSpec, OptimSpec, ScheduleSpec, SegmentRuntime, SegmentSpec
from upscale.workers.engine import release_device_memory
from upscale.workers.model import UpscaleLM
from upscale.workers.segment import run_segment

MOE = ModelSpec(n_layer=1, d_model=16, n_head=2, vocab_size=256, context=16, n_expert=2, topk=1)
SPEC = SegmentSpec(kind="scratch_trunk", model=MOE, data=DataSpec(eval_tokens=256), end_tokens=2 * 64,
                   optim=OptimSpec(lr=1e-3, batch_size=4), schedule=ScheduleSpec(warmup_tokens=64))


def _models() -> int:
    return sum(isinstance(o, UpscaleLM) for o in gc.get_objects())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_finished_segment_on_cuda_leaves_no_model_alive(tmp_path: Path, dist_group: None) -> None:
    release_device_memory("cuda")
    before, held = _models(), torch.cuda.memory_allocated()
    gc.disable()
    try:
        run_segment(SPEC, SegmentRuntime(checkpoint_dir=str(tmp_path / "seg"), data_cache_dir=str(tmp_path / "c"),
                                         device="cuda"))
        assert _models() == before
        assert torch.cuda.memory_allocated() <= held  # nothing of the segment stays on the GPU
    finally:
        gc.enable()
