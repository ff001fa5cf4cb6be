"""One summary of a plan, for every face that shows one: `upscale plan`, `upscale submit` and POST /sweeps (and so
`upscale.Client.submit`). Segments, tokens and FLOPs of the whole plan and of what it would train given the store,
the saving over independent runs, a wall-time estimate, and the laws of the analysis the grid cannot identify with
what to add (fitting/identifiability.py on the planned coordinates)."""

from __future__ import annotations

from upscale.control.identifiability import planned_grid
from upscale.control.schemas import KindTotals, LawCheckPublic, PlanEstimate, PlanSummary, SizeMemoryPublic
from upscale.fitting.identifiability import identifiability
from upscale.orchestrator.plan_in_store import PlanInStore
from upscale.sweeps.memory import GIB, memory_plan, worker_memory
from upscale.sweeps.planner import GPU_FLOPS_PER_S, critical_path_s, gpu_flops_per_s, segment_seconds
from upscale.sweeps.spec import SweepSpec

KIND_ORDER = ("lr_search", "dense_trunk", "dense_decay", "dense_import", "upcycle", "moe_trunk", "moe_decay",
              "scratch_trunk", "scratch_decay", "expand")


def plan_summary(check: PlanInStore, spec: SweepSpec, tokens_per_s: float | None = None,
                 flops_per_s: float | None = None, node_memory: float | None = None) -> PlanSummary:
    """``check``'s plan (of ``spec``) summarised. Without a throughput, a GPU sweep (resources.gpus > 0) is estimated
    at 400 TFLOP/s per GPU of a segment, a CPU sweep from the figures measured on a 2-core CPU (docs/architecture.md,
    "Measured facts"); the estimate counts only what would train (done segments take no time). The memory per worker
is estimated on one GPU of a GPU sweep, on a node of ``node_memory`` bytes of a CPU sweep."""
    p = check.plan
    if not tokens_per_s and not flops_per_s and (gpu := gpu_flops_per_s(spec)):
        flops_per_s = gpu
    seconds = segment_seconds(p, tokens_per_s=tokens_per_s, flops_per_s=flops_per_s)
    new_ids = {s.id for s in check.to_train()}
    to_wait = {k: (v if k in new_ids else 0.0) for k, v in seconds.items()}
    f = check.figures()
    kinds: dict[str, KindTotals] = {}
    for s in p.segments:
        k = kinds.setdefault(s.spec.kind, KindTotals(count=0, tokens=0, flops=0.0, seconds=0.0))
        k.count += 1
        k.tokens += s.tokens
        k.flops += s.flops
        k.seconds += seconds[s.id]
    estimate = PlanEstimate(basis=estimate_basis(tokens_per_s, flops_per_s), serial_s=sum(to_wait.values()),
                            critical_path_s=critical_path_s(p, to_wait),
                            gpu_hours_at_400_tflops=f["new_flops"] / GPU_FLOPS_PER_S / 3600)
    checks = [LawCheckPublic(**c.as_dict()) for c in identifiability(planned_grid(p))]
    return PlanSummary(
        name=p.name, segments=f["segments"], new_segments=f["new_segments"],
        by_kind={k: kinds[k] for k in KIND_ORDER if k in kinds}, observations=len(p.observations()),
        tokens=f["tokens"], new_tokens=f["new_tokens"], total_flops=f["flops"], new_flops=f["new_flops"],
        independent_flops=f["independent_flops"], saving=f["saving"], estimate=estimate,
        memory=memory_summary(spec, node_memory), identifiability=checks,
        notes=list(p.notes), stale_segments=f["stale"], reuse_stale=f["reuse_stale"],
        other_cut_segments=f["other_cut_segments"])


def estimate_basis(tokens_per_s: float | None = None, flops_per_s: float | None = None) -> str:
    """The throughput a time estimate assumes, in words: the plan's and a stored sweep's (control/timing.py)."""
    return (f"{tokens_per_s:g} tokens/s" if tokens_per_s else f"{flops_per_s:g} FLOP/s per segment" if flops_per_s
            else "throughput measured on a 2-core CPU (give --tokens-per-s for your machine)")


def memory_summary(spec: SweepSpec, node_memory: float | None = None) -> list[SizeMemoryPublic]:
    """`memory_plan` of ``spec`` on the device one of its workers fills."""
    memory = worker_memory(spec, node_memory)
    return [SizeMemoryPublic(size=m.label, model=m.model, sequences_per_step=m.rows,
                             micro_batch_size=m.micro_batch_size,
                             accumulation_steps=m.rows // m.micro_batch_size if m.micro_batch_size else None,
                             memory_gib=m.need.total / GIB, state_gib=m.need.state / GIB,
                             device_gib=memory / GIB if memory else None, fits=m.fits)
            for m in memory_plan(spec, memory)]


def stale_lines(stale: dict[str, str], reuse_stale: bool) -> list[str]:
    """What to tell the user about stale segments, or nothing when there are none and none were to be reused."""
    n = len(stale)
    if not n:
        return ["--reuse-stale: no segment of this plan is stale"] if reuse_stale else []
    keys = ", ".join(list(stale)[:5]) + (f" and {n - 5} more" if n > 5 else "")
    what = ("reused (--reuse-stale)" if reuse_stale
            else "retrained under the current version (--reuse-stale reuses them)")
    return [f"{n} segment(s) trained under an older training-semantics version are stale: {what}: {keys}"]
