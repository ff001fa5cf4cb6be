"""Learning-rate schedules as pure functions of absolute token counts (docs/architecture.md, "Segments and WSD reuse").

`lr_multiplier(tokens, schedule, decay_start_tokens, end_tokens)` is the factor applied to the peak LR for the
optimiser step that brings the run to `tokens` trained tokens (so the first step of a run uses
`lr_multiplier(tokens_per_step, ...)` and is never a wasted zero-LR step).

WSD (warmup-stable-decay): linear warmup from 0 to 1 over `warmup_tokens`, constant 1, then from the absolute
`decay_start_tokens` a decay that reaches `final_lr_fraction` exactly at `end_tokens`. The decay start is absolute,
not a ratio of the run length, so a trunk (decay_start_tokens=None: never decays) and any decay branch that resumes
it compute the same multipliers as one uninterrupted WSD run up to the branch point. Cosine is the baseline the
paper compares with: warmup, then a half cosine from 1 to `final_lr_fraction` at `end_tokens`.
"""

from __future__ import annotations

import math

from upscale.sweeps.segments import ScheduleSpec
from upscale.workers.errors import WorkerError


def check_schedule(schedule: ScheduleSpec, decay_start_tokens: int | None, end_tokens: int) -> None:
    """Reject a schedule that cannot be run as asked (instead of clamping it): warmup longer than the budget."""
    if schedule.kind == "cosine" and schedule.warmup_tokens >= end_tokens:
        raise WorkerError(f"budget end_tokens={end_tokens} is not larger than warmup_tokens={schedule.warmup_tokens}")
    if decay_start_tokens is not None and schedule.warmup_tokens > decay_start_tokens:
        raise WorkerError(
            f"budget too small for the warmup: the decay starts at {decay_start_tokens} tokens, before the end of "
            f"warmup_tokens={schedule.warmup_tokens}; use a larger budget or a shorter warmup"
        )


def decay_shape(progress: float, shape: str, final: float) -> float:
    """Multiplier at `progress` in [0, 1] of a decay from 1 to `final`."""
    if shape == "linear":
        return 1.0 - (1.0 - final) * progress
    if shape == "cosine":
        return final + (1.0 - final) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if shape == "1-sqrt":
        return 1.0 - (1.0 - final) * math.sqrt(progress)
    raise WorkerError(f"unknown decay shape {shape!r}; valid: linear, cosine, 1-sqrt")


def lr_multiplier(tokens: int, schedule: ScheduleSpec, decay_start_tokens: int | None, end_tokens: int) -> float:
    """Factor of the peak LR for the step that ends at `tokens` trained tokens (see the module docstring)."""
    if schedule.warmup_tokens and tokens < schedule.warmup_tokens:
        return tokens / schedule.warmup_tokens
    if schedule.kind == "cosine":
        span = end_tokens - schedule.warmup_tokens
        progress = min(1.0, (tokens - schedule.warmup_tokens) / span)
        return decay_shape(progress, "cosine", schedule.final_lr_fraction)
    if decay_start_tokens is None or tokens <= decay_start_tokens:
        return 1.0
    progress = min(1.0, (tokens - decay_start_tokens) / (end_tokens - decay_start_tokens))
    return decay_shape(progress, schedule.decay_shape, schedule.final_lr_fraction)
