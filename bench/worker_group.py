"""Multi-process segments: a 2-worker Ray Train group against one worker on the same cores, in the same run.

Both train the same segment through the orchestrator's Ray task (`orchestrator.task.run_segment_task`) on embedded
Ray with 2 CPUs: one worker with 2 torch threads (the baseline: all the machine's cores in one process), then two
Ray Train workers with 1 thread each (data parallel; an MoE expert parallel, ep_size 2, all-to-all over gloo).
"tokens/s" is the segment's own training throughput as rank 0 measured it (global batch tokens over its training
time: startup, evaluation and checkpoints excluded); "wall s" is the whole task, Ray Train's group start included.
Segments: the `tiny` shape (4 layers, d=128, context 128, batch 16) dense and as an 8x2 MoE, `--steps` steps each.

    .venv/bin/python -u bench/worker_group.py [--steps 24] [--repeats 1]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import ray

from upscale.orchestrator.task import run_segment_task, train_segment
from upscale.sweeps import sizes
from upscale.sweeps.segments import DataSpec, ModelSpec, OptimSpec, ScheduleSpec, SegmentRuntime, SegmentSpec

CONTEXT, BATCH = 128, 16


def segment(n_expert: int, steps: int) -> SegmentSpec:
    shape = sizes.shape_of("tiny")
    model = ModelSpec(n_layer=shape.n_layer, d_model=shape.d_model, n_head=shape.n_head, vocab_size=256,
                      context=CONTEXT, n_expert=n_expert, topk=2 if n_expert else 0)
    tps = CONTEXT * BATCH
    kind = "scratch_trunk" if n_expert else "dense_trunk"
    return SegmentSpec(kind=kind, model=model, data=DataSpec(eval_tokens=4 * tps), end_tokens=steps * tps,
                       optim=OptimSpec(lr=1e-3, batch_size=BATCH), schedule=ScheduleSpec(warmup_tokens=4 * tps))


def run(spec: SegmentSpec, workers: int, home: Path, tag: str) -> tuple[float, float, float]:
    """(tokens/s, wall s, val loss) of one attempt on `workers` processes with 2 cores in all."""
    rt = SegmentRuntime(checkpoint_dir=str(home / tag), data_cache_dir=str(home / "cache"), workers=workers,
                        num_threads=2 // workers, log_every_steps=8)
    options = {"num_cpus": 0} if workers > 1 else {"num_cpus": 2}
    t0 = time.perf_counter()
    result = ray.get(run_segment_task.options(**options).remote(train_segment, spec, rt, spec.id))
    return result["tokens_per_s"], time.perf_counter() - t0, result["val_loss"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24, help="optimiser steps per segment")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each configuration (median reported)")
    args = parser.parse_args()
    ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    print(f"{'segment':<14} {'workers':>7} {'tokens/s':>10} {'wall s':>8} {'val loss':>9} {'x 1 worker':>11}")
    with tempfile.TemporaryDirectory(prefix="upscale-bench-") as tmp:
        home = Path(tmp)
        # warm the token cache and the worker's imports so neither lands in a timed run
        run(segment(0, 2), 1, home, "warm")
        for n_expert, name in ((0, "tiny dense"), (8, "tiny 8x2 MoE")):
            spec = segment(n_expert, args.steps)
            base = None
            for workers in (1, 2):
                runs = [run(spec, workers, home, f"{name}-{workers}-{i}".replace(" ", "_"))
                        for i in range(args.repeats)]
                tps = statistics.median(r[0] for r in runs)
                wall = statistics.median(r[1] for r in runs)
                base = base or tps
                print(f"{name:<14} {workers:>7} {tps:>10,.0f} {wall:>8.1f} {runs[0][2]:>9.4f} {tps / base:>10.2f}x",
                      flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
