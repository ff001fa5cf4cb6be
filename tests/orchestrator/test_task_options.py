"""A segment's Ray task on GPUs runs in a worker used once (its CUDA context and cached blocks go with it); on CPUs
the worker is pooled (torch and DeepSpeed imported once); a Ray Train group's driver task holds nothing."""

from __future__ import annotations

from upscale.orchestrator.task import run_gpu_segment_task, run_segment_task, segment_task


def test_gpu_segments_get_a_fresh_worker_and_cpu_segments_a_pooled_one() -> None:
    (gpu, gpu_opts), (cpu, cpu_opts), (group, group_opts) = (
        segment_task(1, 4, 1), segment_task(1, 2, 0), segment_task(2, 4, 1))
    assert gpu is run_gpu_segment_task and gpu._default_options["max_calls"] == 1
    assert cpu is run_segment_task and cpu._default_options["max_calls"] == 0
    assert (gpu_opts, cpu_opts) == ({"num_cpus": 4, "num_gpus": 1}, {"num_cpus": 2, "num_gpus": 0})
    assert group is run_segment_task and group_opts == {"num_cpus": 0}  # Ray Train's workers hold the GPUs
    for task, options in ((gpu, gpu_opts), (cpu, cpu_opts), (group, group_opts)):
        task.options(**options)  # Ray validates the option names and values here
