"""One segment on several processes: a Ray Train worker group running the segment function on every rank.

`runtime.workers = W > 1` asks for W data/expert-parallel processes (workers/parallel.py). Ray Train places them
(`resources_per_worker` from the sweep, PACK placement, on any node of the cluster), starts the gloo (CPU) or NCCL
(GPU) process group DeepSpeed then runs on, and reports worker failures. Retries are the scheduler's, not Ray
Train's (`max_failures=0`): a failed group is one failed attempt, retried like any other from the segment's last
checkpoint. Rank 0 leaves the result file a single-process attempt leaves (orchestrator/attempt_files.py), so
adoption after a scheduler restart works the same way.
"""

from __future__ import annotations

from upscale.orchestrator.attempt_files import finish_attempt, read_result
from upscale.storage import SegmentFolder
from upscale.sweeps.segments import SegmentResult, SegmentRuntime, SegmentSpec


def run_worker_group(segment_fn, spec: SegmentSpec, runtime: SegmentRuntime, key: str) -> SegmentResult:
    """Run `segment_fn(spec, runtime)` on `runtime.workers` Ray Train workers; returns rank 0's result (also left
    in the segment's folder under `key`). A worker's own exception is re-raised here, the lowest rank's first, so a
    WorkerError (a bad value: retrying cannot help) stays one."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig, TrainingFailedError
    from ray.train.torch import TorchConfig, TorchTrainer

    def loop() -> None:  # runs on every worker; the closure ships the spec and runtime to them
        import ray.train

        result = segment_fn(spec, runtime)
        if ray.train.get_context().get_world_rank() == 0:
            finish_attempt(result, spec, runtime, key)

    # Ray Train's own run files (no checkpoints: retries are the scheduler's) stay on local disk: for a URI
    # checkpoint root, in its staging folder (upscale/storage.py); Ray Train cannot write every fsspec protocol
    ray_train_dir = SegmentFolder.open(runtime.checkpoint_dir, runtime.data_cache_dir).local / "ray-train"
    gpu = runtime.device.startswith("cuda")
    per_worker = {"CPU": runtime.num_threads, **({"GPU": 1} if gpu else {})}
    trainer = TorchTrainer(
        loop,
        torch_config=TorchConfig(backend="nccl" if gpu else "gloo"),
        scaling_config=ScalingConfig(num_workers=runtime.workers, use_gpu=gpu, resources_per_worker=per_worker),
        run_config=RunConfig(name=f"segment-{key}", storage_path=str(ray_train_dir),
                             failure_config=FailureConfig(max_failures=0)),
    )
    try:
        trainer.fit()
    except TrainingFailedError as e:
        failures = getattr(e, "worker_failures", None) or {}
        if failures:
            raise failures[min(failures)] from None
        raise
    result = read_result(runtime.checkpoint_dir, key)
    if result is None:
        raise RuntimeError(f"segment {key}: the worker group finished but rank 0 left no result")
    return result
