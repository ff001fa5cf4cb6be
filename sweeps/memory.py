"""The memory plan of a sweep: per size, its largest model on one worker (a GPU, or a node's RAM) at the micro-batch
it trains with, and the check that refuses a sweep no worker can train, naming the knobs (docs/training.md).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from upscale.sweeps.data_sources import vocab_size_of
from upscale.sweeps.errors import SpecProblem, raise_if
from upscale.sweeps.sizes import MEMORY_HEADROOM, TrainingMemory, expert_widths, largest_micro_batch, training_memory

if TYPE_CHECKING:
    from upscale.sweeps.segments import Shape, UpcycleSpec
    from upscale.sweeps.spec import SweepSpec

GPU_MEMORY_GIB = 80.0  # what the plan assumes one GPU holds when resources.gpu_memory is not given: an H100's
GIB = 1 << 30


@dataclass(frozen=True)
class SizeMemory:
    """One size's largest model as one worker trains it (`memory_plan`)."""

    label: str
    model: str  # "dense 0.1B" or "0.1B as 8x2"
    rows: int  # sequences the worker takes per step
    micro_batch_size: int | None  # per forward pass: the spec's, else the largest that fits; None: none fits
    need: TrainingMemory  # at micro_batch_size (at one sequence when none fits)
    fits: bool


def worker_memory(spec: SweepSpec, node_memory: float | None = None) -> float | None:
    """Bytes one worker may fill: one GPU's (resources.gpu_memory, else GPU_MEMORY_GIB) for a GPU sweep, else the
    node's RAM when known."""
    if spec.resources.gpus:
        return (spec.resources.gpu_memory or GPU_MEMORY_GIB) * GIB
    return node_memory


def memory_plan(spec: SweepSpec, memory: float | None) -> list[SizeMemory]:
    """Per size, its largest model (its MoEs', an expansion's included, and its dense model's
    `sizes.training_memory`) on one worker of
    ``memory`` bytes (None: not known, the whole share of a step is one micro-batch): the spec's micro-batch, or the
    largest dividing a worker's share of the batch that fits MEMORY_HEADROOM of ``memory``, and what it needs."""
    r, t = spec.resources, spec.train
    vocab = spec.model.vocab_size or vocab_size_of(spec.data)
    variants = spec.upcycling.variants()
    out = []
    for label, shape in spec.model.shapes().items():
        o = spec.size_override(label)
        rows = (o.batch_size or t.batch_size) // r.workers
        models = [(0, 0, (shape.d_ff, 0))] + [(e, k, widths) for e, k in spec.moe.configs()
                                              for widths in {(shape.d_ff, 0)} | {_widths(up, shape, e, k)
                                                                                for up in variants}]
        models += [(e, k, (shape.d_ff, 0)) for e, k in spec.expansion.configs()] if spec.expansion else []
        memory_of = [functools.partial(training_memory, shape, e, k, *widths, vocab=vocab, context=t.context,
                                       workers=r.workers, checkpointing=t.activation_checkpointing)
                     for e, k, widths in models]
        worst = max(range(len(models)), key=lambda i: memory_of[i](sequences=rows).total)
        (e, k, _), need = models[worst], memory_of[worst]
        budget = MEMORY_HEADROOM * memory if memory else None
        micro = spec.micro_batch_size(label) or (
            largest_micro_batch(rows, budget, lambda m, need=need: need(sequences=m)) if budget else rows)
        held = need(sequences=micro or 1)
        out.append(SizeMemory(label, f"{label} as {e}x{k}" if e else f"dense {label}", rows, micro, held,
                              micro is not None and (budget is None or held.total <= budget)))
    return out


def check_memory(spec: SweepSpec, node_memory: float | None = None) -> None:
    """Refuse a sweep a worker cannot train (raises SpecError): per size, its largest model at its micro-batch
    (`memory_plan`) on one GPU (a GPU sweep) or one node of ``node_memory`` bytes; each problem names the knobs."""
    memory = worker_memory(spec, node_memory)
    if memory is None:
        return
    where = "a GPU" if spec.resources.gpus else "the largest node"
    problems: list[SpecProblem] = []
    for size in memory_plan(spec, memory):
        if size.fits:
            continue
        n = size.need
        what = (f"{size.model} needs about {n.total / GIB:.3g} GiB per worker at {n.sequences} sequence(s) per "
                f"micro-batch ({n.state / GIB:.3g} GiB of weights, gradients and AdamW state for {n.params:,} "
                f"parameters, {n.activations / GIB:.3g} GiB of activations); {where} has {memory / GIB:.3g} GiB, "
                f"{MEMORY_HEADROOM:.0%} of it usable")
        if size.micro_batch_size is not None:  # the spec's micro-batch is too large
            problems.append((spec.micro_batch_path(size.label),
                             f"{what}: lower it, or leave it unset to take the largest that fits"))
            continue
        knobs = ["more resources.workers (experts split over them)", "a smaller size or context"]
        if not spec.train.activation_checkpointing:
            knobs.insert(0, "train.activation_checkpointing: true")
        if spec.resources.gpus:
            knobs.append("resources.gpu_memory if your GPUs hold more")
        problems.append(("resources", f"{what}: no sequence fits; use {', '.join(knobs)}"))
    raise_if(problems)


def _widths(up: UpcycleSpec, shape: Shape, n_expert: int, topk: int) -> tuple[int, int]:
    """`expert_widths`, or the copied FFN's where the method cannot build this MoE (reported by the spec's check)."""
    try:
        return expert_widths(up, shape.d_ff, n_expert, topk)
    except ValueError:
        return shape.d_ff, 0
