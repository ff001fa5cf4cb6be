"""Planning speed: compile a ~10,000-segment grid with `sweeps.planner.plan`, against a naive planner in the same run.

The baseline is what one writes without WSD reuse: `itertools.product` over the grid, every point its own
independent run (a dense WSD run to D1, then upcycle and an MoE WSD run to D2; or an MoE run to D from scratch), each
run a warmup+constant segment and a decay segment, each built as a `SegmentSpec` and keyed by `spec.id`. It builds
more segments (no sharing) with no memo, so the ratio shows both what dedupe saves in planning work and the speed of
our planner per segment. Target: under 2 s for 10,000 segments, so planning a large grid stays interactive.

    .venv/bin/python bench/plan_speed.py
"""

from __future__ import annotations

import itertools
import time

from upscale.sweeps.planner import plan
from upscale.sweeps.segments import ModelSpec, OptimSpec, ScheduleSpec, SegmentSpec, UpcycleSpec
from upscale.sweeps.spec import SweepSpec, parse_spec
from upscale.sweeps.steps import resolve

STEP = 16 * 128
GRID = {
    "name": "bench-10k",
    "model": {"sizes": ["nano", "micro", "tiny", "15M"]},
    "moe": {"experts": [4, 8], "topk": [1, 2]},
    "upcycling": {"methods": ["naive", "drop"], "r": [0.25, 0.5, 0.75]},
    "tokens": {"d1": [STEP * 100 * i for i in range(1, 11)], "d2": [STEP * 100 * i for i in range(1, 15)],
               "scratch": [STEP * 100 * i for i in range(1, 15)]},
    "train": {"context": 128, "batch_size": 16, "lr": {"dense": 3e-3, "moe": 2e-3}, "warmup_tokens": STEP * 10},
}


def naive_plan(spec: SweepSpec) -> int:
    """Every grid point as its own independent runs, no sharing; returns the number of segments built."""
    t = spec.train
    vocab = 256
    n = 0

    def run(kind: str, model: ModelSpec, lr: float, steps: int, start: int, parents: tuple[str, ...]) -> str:
        nonlocal n
        optim = OptimSpec(lr=lr, batch_size=t.batch_size)
        schedule = ScheduleSpec(warmup_tokens=round(t.warmup_tokens))
        trunk = SegmentSpec(kind=f"{kind}_trunk", model=model, data=spec.data, optim=optim, schedule=schedule,
                            end_tokens=start * STEP, save_at_tokens=(start * STEP,), parent_ids=parents)
        decay = SegmentSpec(kind=f"{kind}_decay", model=model, data=spec.data, optim=optim, schedule=schedule,
                            start_tokens=start * STEP, end_tokens=steps * STEP, decay_start_tokens=start * STEP,
                            parent_ids=(trunk.id,))
        n += 2
        return decay.id

    for rc in resolve(spec).recipes:
        s = rc.shape

        def model(e: int = 0, k: int = 0, s=s) -> ModelSpec:
            return ModelSpec(n_layer=s.n_layer, d_model=s.d_model, n_head=s.n_head, vocab_size=vocab,
                             context=t.context, n_expert=e, topk=k)

        for d1, start1 in zip(rc.d1.steps, rc.d1.decay_start_steps, strict=True):
            run("dense", model(), t.lr.dense, d1, start1, ())
        for (e, k), up, (d1, s1), (d2, s2) in itertools.product(
                spec.moe.configs(), spec.upcycling.variants(), zip(rc.d1.steps, rc.d1.decay_start_steps, strict=True),
                zip(rc.d2.steps, rc.d2.decay_start_steps, strict=True)):
            dense_id = run("dense", model(), t.lr.dense, d1, s1, ())
            upcycle = SegmentSpec(kind="upcycle", model=model(e, k), data=spec.data,
                                  upcycle=UpcycleSpec(**up.model_dump()), parent_ids=(dense_id,))
            n += 1
            run("moe", model(e, k), t.lr.moe, d2, s2, (upcycle.id,))
        for (e, k), (d, s0) in itertools.product(spec.moe.configs(),
                                                 zip(rc.scratch.steps, rc.scratch.decay_start_steps, strict=True)):
            run("scratch", model(e, k), t.lr.moe, d, s0, ())
    return n


def _best_of(fn, repeats: int) -> tuple[float, float, object]:
    """Best wall and CPU seconds over `repeats` runs (CPU time is steadier on a shared 2-core machine)."""
    wall, cpu, out = float("inf"), float("inf"), None
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        wall, cpu = min(wall, time.perf_counter() - w0), min(cpu, time.process_time() - c0)
    return wall, cpu, out


def main() -> None:
    spec = parse_spec(GRID)
    ours_s, ours_cpu, p = _best_of(lambda: plan(spec), 3)
    base_s, base_cpu, n_base = _best_of(lambda: naive_plan(spec), 2)
    n = len(p.segments)
    print(f"grid: 4 sizes x 10 D1 x 14 D2 x 4 MoE configs x 4 upcycling variants + 14 scratch budgets; {p.by_kind()}")
    print(f"ours:     {n:6d} segments (shared WSD trunks) in {ours_s:.3f} s wall, {ours_cpu:.3f} s CPU "
          f"({ours_cpu / n * 1e6:.0f} us/segment)")
    print(f"baseline: {n_base:6d} segments (independent runs) in {base_s:.3f} s wall, {base_cpu:.3f} s CPU "
          f"({base_cpu / n_base * 1e6:.0f} us/segment)")
    print(f"ratio baseline/ours: {base_cpu / ours_cpu:.1f}x CPU time, {n_base / n:.1f}x segments; "
          f"plan saving (FLOPs) x{p.saving:.2f}; target < 2 s: {'met' if ours_s < 2 else 'MISSED'}")


if __name__ == "__main__":
    main()
